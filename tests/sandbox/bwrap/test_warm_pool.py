"""The warm pool and admission control."""

from __future__ import annotations

import asyncio
import time

import pytest

from sandrl.errors import CapacityExhaustedError
from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.sandbox.bwrap.warm_pool import PooledProvider

from ...support import needs_sandbox

pytestmark = needs_sandbox


async def test_pool_hands_out_precreated_fresh_sandboxes(provider: BwrapProvider) -> None:
    spec = SandboxSpec(ttl_s=60)
    pooled = PooledProvider(provider, pools=[(spec, 3)])
    try:
        pool = pooled.pool(spec)
        assert pool is not None
        await pool.wait_full()
        assert len(pool.idle) == 3
        first = await pooled.create(spec)
        assert first in pooled.live
        await first.exec("echo dirty > /workspace/mark")
        await first.close()
        second = await pooled.create(spec)
        assert second.id != first.id
        assert (await second.exec("cat /workspace/mark")).exit_code != 0  # never a reused sandbox
        await second.close()
        await pool.wait_full()
        assert len(pool.idle) == 3  # refilled in the background
    finally:
        await pooled.close()
    assert not pooled.live


async def test_pooled_sandbox_ttl_starts_at_hand_out(provider: BwrapProvider) -> None:
    spec = SandboxSpec(ttl_s=2)
    pooled = PooledProvider(provider, pools=[(spec, 1)])
    try:
        pool = pooled.pool(spec)
        assert pool is not None
        await pool.wait_full()
        await asyncio.sleep(1.2)
        sb = await pooled.create(spec)
        before = time.time()
        await asyncio.sleep(1.2)  # 2.4 s after it was pooled, 1.2 s after hand-out
        assert (await sb.exec("echo alive")).stdout == "alive\n"
        assert sb.expires_at >= before + 1.5
    finally:
        await pooled.close()


async def test_unpooled_spec_is_created_on_demand(provider: BwrapProvider) -> None:
    pooled = PooledProvider(provider, pools=[(SandboxSpec(), 1)])
    try:
        sb = await pooled.create(SandboxSpec(memory_mb=256))
        assert sb.spec.memory_mb == 256
        await sb.close()
    finally:
        await pooled.close()


async def test_max_live_refuses_with_a_clear_error(provider: BwrapProvider) -> None:
    pooled = PooledProvider(provider, max_live=2)
    try:
        a = await pooled.create()
        b = await pooled.create()
        with pytest.raises(CapacityExhaustedError, match="max_live=2"):
            await pooled.create()
        await a.close()
        c = await pooled.create()  # room again after a close
        await asyncio.gather(b.close(), c.close())
    finally:
        await pooled.close()


async def test_max_live_can_wait_for_room(provider: BwrapProvider) -> None:
    pooled = PooledProvider(provider, max_live=1, on_full="wait", wait_timeout_s=10)
    try:
        a = await pooled.create()
        waiter = asyncio.create_task(pooled.create())
        await asyncio.sleep(0.3)
        assert not waiter.done()
        await a.close()
        b = await asyncio.wait_for(waiter, 10)
        await b.close()
    finally:
        await pooled.close()


async def test_provider_max_live(state_dir) -> None:  # type: ignore[no-untyped-def]
    small = BwrapProvider(state_dir, max_live=1)
    a = await small.create()
    try:
        with pytest.raises(CapacityExhaustedError, match="max_live=1"):
            await small.create()
    finally:
        await a.close()
