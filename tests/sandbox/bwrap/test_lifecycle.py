"""Lifecycle: close, crash, reaping, and no leaks over many cycles."""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from sandrl.errors import SandboxClosedError
from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.sandbox.bwrap.sandbox import HOST_CLEANUP

from ...support import kill_9_after_first_line, needs_sandbox

pytestmark = needs_sandbox


def _mounts() -> int:
    return len(Path("/proc/self/mountinfo").read_text().splitlines())


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _children() -> set[int]:
    """This process's children, zombies included, whichever of its threads started them."""
    found: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        found.update(int(pid) for pid in (task / "children").read_text().split())
    return found


def _no_launches_made_ahead(provider: BwrapProvider) -> None:
    """A leak test's premise: its creates are full launches. A pool of launches made ahead (a fork's,
    :mod:`sandrl.sandbox.bwrap.premade`) would hand them out and refill in the background, making
    records, cgroups and processes that are the pool's, not leaks (and not this test's launches)."""
    premade = provider.premade
    assert not premade.target and not any(premade.idle.values()), (
        "an earlier test left this shared provider keeping launches made ahead: close them in that test"
    )


async def test_close_twice_is_harmless(provider: BwrapProvider) -> None:
    sb = await provider.create(SandboxSpec())
    await sb.close()
    await sb.close()
    assert sb.closed
    with pytest.raises(SandboxClosedError, match="closed"):
        await sb.exec("true")


async def test_close_with_running_children(provider: BwrapProvider) -> None:
    sb = await provider.create(SandboxSpec())
    await sb.exec("nohup sleep 1000 >/dev/null 2>&1 & nohup sh -c 'while :; do :; done' >/dev/null 2>&1 &")
    running = asyncio.create_task(sb.exec("sleep 500", timeout_s=600))
    await asyncio.sleep(0.3)
    await sb.close()
    with pytest.raises(SandboxClosedError):
        await running
    assert provider.state.sandbox_processes({sb.uid}) == []
    assert sb.id not in provider.cgroups.stale_groups()


def test_a_zombie_of_a_sandbox_uid_is_not_a_process_left_running(provider: BwrapProvider) -> None:
    # Processes whose parent died first go to the host's init, which may reap them late: dead, they
    # are no leftover of a sandbox's, while anything alive as its uid is.
    slot = provider.state.acquire_slot()  # a uid range no sandbox has while this runs
    uid = slot.uid + 1
    dead = subprocess.Popen(["true"], user=uid, group=uid)
    alive = subprocess.Popen(["sleep", "30"], user=uid, group=uid)
    try:
        deadline = time.monotonic() + 10
        while "Z" not in _state(dead.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "Z" in _state(dead.pid)  # exited, not reaped: a zombie
        assert provider.state.sandbox_processes({uid}) == [alive.pid]
    finally:
        alive.kill()
        alive.wait()
        dead.wait()
        slot.release()


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/status") as f:
        return next(line for line in f if line.startswith("State:"))


async def test_cancelled_exec_kills_its_command(sandbox) -> None:  # type: ignore[no-untyped-def]
    task = asyncio.create_task(sandbox.exec("sleep 77", timeout_s=100))
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.2)
    assert "sleep 77" not in (await sandbox.exec("ps -eo args --no-headers")).stdout


async def test_sandbox_dying_on_its_own_is_cleaned_up(provider: BwrapProvider) -> None:
    sb = await provider.create(SandboxSpec())
    # Kill the sandbox's processes from the host, as an OOM killer or an operator might.
    sb._group.kill()
    for _ in range(250):
        if sb.closed and not provider.state.record_dir(sb.id).exists():
            break
        await asyncio.sleep(0.02)
    assert sb.closed
    assert sb.id not in provider.cgroups.stale_groups()
    with pytest.raises(SandboxClosedError):
        await sb.exec("true")


def test_kill_9_of_provider_then_reaped_by_a_new_one(state_dir: Path, provider: BwrapProvider) -> None:
    ids = kill_9_after_first_line(
        f"""
        import asyncio, sys
        from sandrl.sandbox.bwrap import BwrapProvider
        async def main():
            p = BwrapProvider({str(state_dir)!r})
            sbs = [await p.create() for _ in range(3)]
            for s in sbs:
                await s.exec("nohup sleep 1000 >/dev/null 2>&1 &")
            print(" ".join(s.id for s in sbs), flush=True)
            await asyncio.sleep(1000)
        asyncio.run(main())
        """
    ).split()
    assert len(ids) == 3
    # With the provider gone its sandboxes' supervisors see the socket close and exit.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(provider.state.slot_owner(i) for i in _slots(provider, ids)):
        time.sleep(0.05)
    leftovers = provider.cgroups.stale_groups()
    assert all(sid in leftovers for sid in ids)  # cgroups and records are left behind by the crash...
    fresh = BwrapProvider(state_dir)
    assert set(ids) <= set(fresh.reaped)  # ...and a new provider removes them
    assert not any(sid in fresh.cgroups.stale_groups() for sid in ids)
    assert not any(provider.state.record_dir(sid).exists() for sid in ids)


def _slots(provider: BwrapProvider, ids: list[str]) -> list[int]:
    slots = []
    for sid in ids:
        meta = provider.state.read_record(sid)
        if meta and isinstance(meta.get("slot"), int):
            slots.append(int(meta["slot"]))  # type: ignore[arg-type]
    return slots


@pytest.mark.slow
async def test_200_create_close_cycles_leak_nothing(provider: BwrapProvider) -> None:
    _no_launches_made_ahead(provider)
    async with await provider.create(SandboxSpec()) as warm:
        await warm.exec("true")
    mounts, fds = _mounts(), _fds()
    records, groups = set(provider.state.records()), set(provider.cgroups.stale_groups())
    uids = set()
    for i in range(200):
        sb = await provider.create(SandboxSpec())
        uids.add(sb.uid)
        if i % 20 == 0:
            assert (await sb.exec("echo $HOSTNAME")).stdout.strip() == sb.id
        await sb.close()
    await asyncio.sleep(0.1)
    assert _mounts() == mounts
    assert _fds() == fds
    assert set(provider.state.records()) == records
    assert set(provider.cgroups.stale_groups()) == groups
    assert provider.state.leaked_processes(uids) == []
    assert not provider.live


def test_a_paused_sandbox_of_a_crashed_provider_is_reaped(state_dir: Path, provider: BwrapProvider) -> None:
    sid, uid = kill_9_after_first_line(
        f"""
        import asyncio
        from sandrl.sandbox.base import SandboxSpec
        from sandrl.sandbox.bwrap import BwrapProvider
        async def main():
            p = BwrapProvider({str(state_dir)!r})
            sb = await p.create(SandboxSpec(ttl_s=30))
            await sb.exec("nohup sh -c 'while :; do :; done' >/dev/null 2>&1 &")
            await sb.pause()
            print(sb.id, sb.uid, flush=True)
            await asyncio.sleep(1000)
        asyncio.run(main())
        """
    ).split()
    meta = provider.state.read_record(sid)
    assert meta is not None and isinstance(meta["paused"], dict)
    assert 25 < meta["paused"]["ttl_left_s"] <= 30 and meta["paused"]["deadline"] > time.time() + 25
    time.sleep(0.5)
    # Frozen, its processes cannot see their provider go: they live on, holding the slot.
    (slot,) = _slots(provider, [sid])
    assert provider.state.slot_owner(slot) == sid and provider.state.sandbox_processes({int(uid)})
    fresh = BwrapProvider(state_dir)
    assert sid in fresh.reaped
    deadline = time.monotonic() + 5
    while provider.state.sandbox_processes({int(uid)}) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert provider.state.sandbox_processes({int(uid)}) == [] and provider.state.slot_owner(slot) is None
    assert sid not in fresh.cgroups.stale_groups() and not provider.state.record_dir(sid).exists()


async def test_a_paused_sandbox_of_a_live_provider_is_not_reaped(state_dir: Path, provider: BwrapProvider) -> None:
    async with await provider.create(SandboxSpec(ttl_s=30)) as sb:
        await sb.pause()
        assert sb.id not in BwrapProvider(state_dir).reaped
        await sb.resume()
        meta = provider.state.read_record(sb.id)
        assert meta is not None and "paused" not in meta  # running again: nothing to reap
        assert (await sb.exec("echo alive")).stdout == "alive\n"


async def test_a_stuck_removal_does_not_hold_up_creates(provider: BwrapProvider) -> None:
    """Removals wait on the kernel (a cgroup that will not empty: up to 10 s); creates run on threads of their own."""
    release = threading.Event()
    stuck = [HOST_CLEANUP.submit(release.wait, 30) for _ in range(HOST_CLEANUP._max_workers)]
    sb = None
    try:
        async with asyncio.timeout(20):  # every removal thread is taken: a create must not wait for one
            sb = await provider.create(SandboxSpec())
            assert (await sb.exec("echo made")).stdout == "made\n"
        assert not any(f.done() for f in stuck)
    finally:
        release.set()
        if sb is not None:
            await sb.close()  # its own removal waits for a free thread, which it now has
    assert all(f.result() for f in stuck)


async def test_cancelled_creates_leak_nothing(provider: BwrapProvider) -> None:
    """A create cancelled at any point (its launch runs in a thread) leaves no slot, record, cgroup or process."""
    _no_launches_made_ahead(provider)
    async with await provider.create(SandboxSpec()) as warm:
        await warm.exec("true")

    def traces() -> tuple[set[str], set[str], int, set[int]]:
        return set(provider.state.records()), set(provider.cgroups.stale_groups()), _fds(), _children()

    before = traces()
    for delay in (0, 0.001, 0.003, 0.006, 0.01, 0.02, 0.05):
        tasks = [asyncio.create_task(provider.create(SandboxSpec())) for _ in range(4)]
        await asyncio.sleep(delay)
        for task in tasks:
            task.cancel()
        made = await asyncio.gather(*tasks, return_exceptions=True)
        for sb in made:
            if not isinstance(sb, BaseException):
                await sb.close()
    deadline = time.monotonic() + 10
    while traces() != before and time.monotonic() < deadline:  # the undo of a cancelled launch runs in a thread
        await asyncio.sleep(0.05)
    assert traces() == before  # killed and reaped (other providers' sandboxes on the host are not ours)
    assert not provider.live
