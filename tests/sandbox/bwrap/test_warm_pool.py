"""The warm pool and admission control."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest

from sandrl.errors import CapacityExhaustedError
from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider, premade
from sandrl.sandbox.bwrap.warm_pool import PooledProvider, WarmPool

from ...support import needs_sandbox

pytestmark = needs_sandbox


@contextlib.asynccontextmanager
async def full_pool(
    provider: BwrapProvider, spec: SandboxSpec, size: int = 1
) -> AsyncIterator[tuple[PooledProvider, WarmPool]]:
    """A pooled provider with one pool of ``spec``, full; closed after."""
    pooled = PooledProvider(provider, pools=[(spec, size)])
    try:
        pool = pooled.pool(spec)
        assert pool is not None
        await pool.wait_full()
        yield pooled, pool
    finally:
        await pooled.close()


async def test_pool_hands_out_precreated_fresh_sandboxes(provider: BwrapProvider) -> None:
    spec = SandboxSpec(ttl_s=60)
    async with full_pool(provider, spec, 3) as (pooled, pool):
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
    assert not pooled.live


async def test_pooled_sandbox_ttl_starts_at_hand_out(provider: BwrapProvider) -> None:
    spec = SandboxSpec(ttl_s=2)
    async with full_pool(provider, spec) as (pooled, _):
        await asyncio.sleep(1.2)
        sb = await pooled.create(spec)
        before = time.time()
        await asyncio.sleep(1.2)  # 2.4 s after it was pooled, 1.2 s after hand-out
        assert (await sb.exec("echo alive")).stdout == "alive\n"
        assert sb.expires_at >= before + 1.5


async def test_a_hand_out_does_not_wait_for_the_agent_to_take_its_ttl(provider: BwrapProvider) -> None:
    """The TTL goes ahead of the caller's first request (the agent reads them in order), not as a
    round trip before the sandbox is handed out: here the agent cannot answer until it is thawed."""
    spec = SandboxSpec(ttl_s=30)
    async with full_pool(provider, spec) as (pooled, pool):
        pooled_sandbox = pool.idle[0]
        await asyncio.to_thread(pooled_sandbox._group.freeze, True)
        try:
            started = time.monotonic()
            sb = await asyncio.wait_for(pooled.create(spec), 5)
            assert time.monotonic() - started < 1.0
            assert sb is pooled_sandbox
        finally:
            await asyncio.to_thread(pooled_sandbox._group.freeze, False)
        assert (await sb.exec("echo alive")).stdout == "alive\n"
        assert 25 < sb.expires_at - time.time() <= 30


async def test_the_refill_waits_until_the_sandbox_handed_out_has_run_a_command(
    provider: BwrapProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refill's create beside the hand-out's first command competes with it for the CPUs (on 2
    cores the warm create took twice as long); it starts once that command has ended."""
    monkeypatch.setattr(premade, "REFILL_HOLD_S", 60.0)
    spec = SandboxSpec(ttl_s=60)
    async with full_pool(provider, spec) as (pooled, pool):
        sb = await pooled.create(spec)
        await asyncio.sleep(0.5)  # ample for a create (~10-20 ms) were the refill not held
        assert not pool.idle and not pool.creating
        await sb.exec("true")
        await pool.wait_full(timeout_s=10)
        assert len(pool.idle) == 1


async def test_the_refill_waits_no_longer_than_its_bound(
    provider: BwrapProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(premade, "REFILL_HOLD_S", 0.2)
    spec = SandboxSpec(ttl_s=60)
    async with full_pool(provider, spec) as (pooled, pool):
        await pooled.create(spec)  # and it runs nothing
        await pool.wait_full(timeout_s=10)
        assert len(pool.idle) == 1


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
