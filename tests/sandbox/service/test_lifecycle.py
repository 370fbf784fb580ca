"""Server-side lifecycle: TTL expiry and extension, admission control and queueing, drain, and no leaks."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from sandrl.errors import CapacityExhaustedError, SandboxNotFoundError, SandboxUnavailableError
from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.sandbox.remote.config import ClientConfig
from sandrl.sandbox.remote.provider import RemoteProvider
from sandrl.sandbox.service.state import SandboxService, ServiceConfig

from ...support import host_mounts, needs_sandbox, sandbox_mounts_added
from .conftest import Served, serving

pytestmark = needs_sandbox


async def _gone(remote: RemoteProvider, sid: str, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            await remote.get(sid)
        except SandboxNotFoundError:
            return True
        await asyncio.sleep(0.05)
    return False


async def test_ttl_expiry_kills_the_sandbox_whatever_the_client_does(remote: RemoteProvider, served: Served) -> None:
    sb = await remote.create(SandboxSpec(ttl_s=1))
    await sb.exec("nohup sleep 1000 >/dev/null 2>&1 &")
    uid = next(s.uid for s in list(served.provider.live) if s.id == sb.id)
    assert await _gone(remote, sb.id, 5)
    with pytest.raises(SandboxNotFoundError, match="TTL"):
        await sb.exec("true")
    await asyncio.sleep(0.2)
    assert served.provider.state.sandbox_processes({uid}) == []
    assert sb.id not in served.provider.cgroups.stale_groups()


async def test_timeout_extends_the_ttl(remote: RemoteProvider) -> None:
    sb = await remote.create(SandboxSpec(ttl_s=1))
    await sb.set_ttl(30)
    assert sb.info.expires_at - time.time() > 25
    await asyncio.sleep(1.5)
    assert (await sb.exec("echo alive")).stdout == "alive\n"  # past the first TTL, also for the agent's own timer
    await sb.set_ttl(0.5)
    assert await _gone(remote, sb.id, 5)


async def test_capacity_exhausted_then_queued(bwrap: BwrapProvider) -> None:
    with serving(bwrap, ServiceConfig(max_live=2), token=None) as s:
        async with RemoteProvider(s.url, token="") as remote:
            a = await remote.create(SandboxSpec(ttl_s=60))
            b = await remote.create(SandboxSpec(ttl_s=60))
            with pytest.raises(CapacityExhaustedError, match="max-live 2") as err:
                await remote.create(SandboxSpec(ttl_s=60))
            assert err.value.http_status == 429 and "wait_s" in err.value.message

            async def free_later() -> None:
                await asyncio.sleep(0.5)
                await a.close()

            started = time.monotonic()
            freeing = asyncio.create_task(free_later())
            c = await remote.create(SandboxSpec(ttl_s=60), wait_s=10)
            await freeing
            assert 0.4 < time.monotonic() - started < 5
            with pytest.raises(CapacityExhaustedError, match=r"waited 0\.3 s"):
                await remote.create(SandboxSpec(ttl_s=60), wait_s=0.3)
            await b.close()
            await c.close()


async def test_drain_lets_running_execs_finish_then_closes_all(bwrap: BwrapProvider) -> None:
    with serving(bwrap, ServiceConfig(drain_grace_s=10)) as s:
        async with RemoteProvider(s.url, token=s.token) as remote:
            idle = await remote.create(SandboxSpec(ttl_s=60))
            busy = await remote.create(SandboxSpec(ttl_s=60))
            running = asyncio.create_task(busy.exec("sleep 1; echo finished"))
            await asyncio.sleep(0.3)
            draining = asyncio.run_coroutine_threadsafe(s.service.shutdown(), _loop_of(s))
            await asyncio.sleep(0.1)
            with pytest.raises(SandboxUnavailableError) as err:
                await remote.create(SandboxSpec())
            assert err.value.error_code == "service_draining" and err.value.http_status == 503
            assert (await running).stdout == "finished\n"
            await asyncio.wrap_future(draining)
            assert not s.service.entries
            assert all(sb.id not in {idle.id, busy.id} for sb in list(bwrap.live))


def _loop_of(s: Served) -> asyncio.AbstractEventLoop:
    assert s.service.loop is not None
    return s.service.loop


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def _soak(served: Served, cycles: int, concurrency: int = 8) -> None:
    async with RemoteProvider(served.url, token=served.token, config=ClientConfig(retries=0)) as remote:
        async with await remote.create(SandboxSpec()) as warm:
            await warm.exec("true")
        await asyncio.sleep(0.2)
        provider = served.provider
        fds, mounts = _fds(), host_mounts()
        records, groups = set(provider.state.records()), set(provider.cgroups.stale_groups())
        uids: set[int] = set()
        sem = asyncio.Semaphore(concurrency)

        async def cycle(i: int) -> None:
            async with sem:
                sb = await remote.create(SandboxSpec(ttl_s=120), metadata={"soak": "1"})
                for s in list(provider.live):
                    if s.id == sb.id:
                        uids.add(s.uid)
                r = await sb.exec(f"echo {i}")
                assert r.stdout == f"{i}\n"
                await sb.close()

        await asyncio.gather(*(cycle(i) for i in range(cycles)))
        await asyncio.sleep(0.3)
        assert not await remote.list_sandboxes({"soak": "1"})
    assert not any(e.metadata.get("soak") for e in served.service.entries.values())
    assert set(provider.state.records()) == records
    assert set(provider.cgroups.stale_groups()) == groups
    assert provider.state.leaked_processes(uids) == []
    assert sandbox_mounts_added(mounts, provider.state.root) == []
    # The server runs in this process: its ends of the client's keep-alive connections close a
    # moment after the client's do.
    for _ in range(100):
        if _fds() <= fds + 2:
            break
        await asyncio.sleep(0.05)
    assert _fds() <= fds + 2, "file descriptors leak"


@pytest.mark.slow
async def test_soak_2000_cycles_leak_nothing(served: Served) -> None:
    await _soak(served, 2000)


async def test_a_sandbox_paused_too_long_is_closed(bwrap: BwrapProvider) -> None:
    service = SandboxService(bwrap, ServiceConfig(max_paused_s=1))
    entry = await service.create(SandboxSpec(ttl_s=60))
    assert await service.pause(entry)
    await asyncio.sleep(0.5)
    await service.resume(entry)  # a resume stops the paused clock
    assert await service.pause(entry)
    await asyncio.sleep(0.8)
    assert entry.id in service.entries  # 0.8 s paused this time
    deadline = time.monotonic() + 5
    while entry.id in service.entries and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    with pytest.raises(SandboxNotFoundError, match="stayed paused for 1 s"):
        service.get(entry.id)
