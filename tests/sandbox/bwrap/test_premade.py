"""Launches made ahead for a fork's children (sandrl.sandbox.bwrap.premade), with real sandboxes."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from sandrl.errors import SandboxCreateError
from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider, premade
from sandrl.sandbox.bwrap.images import HOST_IMAGE
from sandrl.sandbox.bwrap.launch import Launch, PremadeKind
from sandrl.sandbox.bwrap.state import Slot

from ...support import kill_9_after_first_line, needs_sandbox
from .surface import facets

pytestmark = needs_sandbox

SPEC = SandboxSpec(ttl_s=120, memory_mb=300, pids=200)
KIND = PremadeKind.of(SPEC)


_UIDS: dict[int, set[int]] = {}
"""The slot uids each provider of these tests took (by ``id``): slots are machine-wide, so another
provider's sandboxes (a demo beside the tests) run as sandbox uids too and are not these tests'."""


@pytest.fixture
async def own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[BwrapProvider]:
    provider = BwrapProvider(tmp_path / "state")
    taken = _UIDS.setdefault(id(provider), set())
    acquire = provider.state.acquire_slot

    def recorded() -> Slot:
        slot = acquire()
        taken.add(slot.uid)
        return slot

    monkeypatch.setattr(provider.state, "acquire_slot", recorded)
    try:
        yield provider
    finally:
        await provider.close_all()
        del _UIDS[id(provider)]


def _leftovers(provider: BwrapProvider, uids: set[int] | None = None) -> tuple[list[str], list[str], list[int]]:
    """Records, cgroups and processes left of the sandboxes of ``uids`` (those ``provider`` made)."""
    uids = _UIDS[id(provider)] if uids is None else uids
    assert uids, "no sandbox uids to look for"
    processes = provider.state.sandbox_processes(uids)
    return provider.state.records(), list(provider.cgroups.stale_groups()), processes


async def test_a_fork_keeps_launches_for_the_next_and_its_children_are_whole_sandboxes(own: BwrapProvider) -> None:
    async with await own.create(SPEC) as parent:
        await parent.exec("echo from-parent > /workspace/f")
        first = await parent.fork(3)
        await asyncio.gather(*(c.close() for c in first))
        await own.premade.wait_full()
        made = list(own.premade.idle[KIND])
        assert len(made) == 3
        for launch in made:  # waiting: a live helper, its limits written, its record marked
            assert launch.proc is not None and launch.proc.poll() is None
            assert launch.group is not None and launch.group.memory is not None
            limit = (launch.group.memory / "memory.limit_in_bytes").read_text().strip()
            assert int(limit) == 300 << 20
            assert own.state.read_record(launch.sid) == {**own.state.read_record(launch.sid), "premade": True}
        taken = own.premade.taken
        children = await parent.fork(3)
        try:
            assert own.premade.taken == taken + 3
            assert {c.id for c in children} == {launch.sid for launch in made}
            await children[0].exec("echo mine > /workspace/g")
            for child in children:
                seen = await child.exec("cat /workspace/f; ls /workspace; id -u; cat /proc/net/dev | tail -n +3")
                assert seen.exit_code == 0, seen.stderr
                lines = seen.stdout.split()
                assert lines[0] == "from-parent" and lines.count("g") == (1 if child is children[0] else 0)
                assert "0" in lines and "lo:" in seen.stdout and "eth0" not in seen.stdout  # root, loopback only
                record = own.state.read_record(child.id)
                assert record is not None and "premade" not in record
                assert isinstance(record["spec"], dict) and record["spec"]["image"].startswith("fork-")
            assert len({c.uid for c in children}) == 3
            hog = await children[1].exec("python3 -c 'b = bytearray(600 << 20); print(len(b))'", timeout_s=30)
            assert hog.exit_code != 0  # the spec's memory limit holds in a child made ahead
        finally:
            await asyncio.gather(*(c.close() for c in children))
    await own.premade.wait_full()
    assert len(own.premade.idle[KIND]) == 3  # refilled for the fork after
    await own.close_all()
    assert _leftovers(own) == ([], [], [])


async def test_a_child_made_ahead_has_the_surface_of_a_full_launch(own: BwrapProvider) -> None:
    """Pid 1's capabilities, seccomp and session, the mount table, /dev and /proc of a launch made
    ahead must be what a full launch makes (and that, bubblewrap's: ``test_launchers``)."""
    async with await own.create(SPEC) as full:
        by_full = await facets(full)
    own.premade.want(KIND, 1)
    await own.premade.wait_full()
    taken = own.premade.taken
    async with await own.create(SPEC) as ahead:
        assert own.premade.taken == taken + 1
        by_ahead = await facets(ahead)
    assert by_ahead == by_full
    assert "CapBnd:\t00000000a80425fb" in by_ahead  # Docker's set (launch.DEFAULT_CAPS)
    assert "/proc/cmdline ro,nosuid,nodev,relatime tmpfs sandrl" in by_ahead
    assert "/ rw,nosuid,nodev,relatime overlay overlay" in by_ahead


@pytest.mark.parametrize("entry", ["dev", "proc"])
async def test_an_image_whose_dev_or_proc_is_a_symlink_is_refused(
    own: BwrapProvider, tmp_path: Path, entry: str
) -> None:
    """Pid 1 moves /proc and /dev into the root while it is still in the host's tree, where a
    symlink of the image would lead: it refuses one."""
    layer = tmp_path / "layer"
    layer.mkdir()
    (layer / entry).symlink_to("/etc")
    name = f"sandrl-test-{entry}-symlink-{uuid.uuid4().hex[:8]}"
    own.images.add_image(name, [own.images.add_layer(layer)], base=HOST_IMAGE)
    try:
        own.premade.want(KIND, 1)
        await own.premade.wait_full()
        with pytest.raises(SandboxCreateError, match=f"the image's /{entry} is not a directory"):
            await own.create(replace(SPEC, image=name))
        assert own.premade.taken == 1
    finally:
        own.images.remove(name)


async def test_the_refill_waits_until_the_forks_children_have_run_a_command(
    own: BwrapProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(premade, "REFILL_HOLD_S", 60.0)
    async with await own.create(SPEC) as parent:
        children = await parent.fork(2)
        try:
            await asyncio.sleep(0.3)  # ample for a launch (~10 ms) were the refill not held
            assert len(own.premade.idle[KIND]) == 0
            await children[0].exec("true")
            await asyncio.sleep(0.3)
            assert len(own.premade.idle[KIND]) == 0  # the other child has not started yet
            await children[1].exec("true")
            await own.premade.wait_full()
            assert len(own.premade.idle[KIND]) == 2
        finally:
            await asyncio.gather(*(c.close() for c in children))


async def test_the_refill_waits_no_longer_than_its_bound(own: BwrapProvider, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(premade, "REFILL_HOLD_S", 0.2)
    async with await own.create(SPEC) as parent:
        children = await parent.fork(2)  # and neither runs a command
        try:
            await own.premade.wait_full()
            assert len(own.premade.idle[KIND]) == 2
        finally:
            await asyncio.gather(*(c.close() for c in children))


async def test_a_launch_whose_helper_died_is_replaced_by_a_full_one(own: BwrapProvider) -> None:
    own.premade.want(KIND, 2)
    await own.premade.wait_full()
    victims = list(own.premade.idle[KIND])
    for launch in victims:
        assert launch.proc is not None
        launch.proc.kill()
        launch.proc.wait()
    async with await own.create(SPEC) as sandbox:
        assert sandbox.id not in {launch.sid for launch in victims}
        assert (await sandbox.exec("echo ok")).stdout == "ok\n"
    await own.close_all()
    assert _leftovers(own) == ([], [], [])


async def test_close_all_waits_for_the_launch_a_refill_was_making(
    own: BwrapProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refill stopped by ``close_all`` while its launch was being made undoes it once made, in the
    refill's thread: ``close_all`` returned before that, and a caller that then looked (a run's check
    for leftovers, a test's) found the launch's record and cgroups."""
    made, go_on = threading.Event(), threading.Event()
    premake = own.launcher.premake

    def slow_premake(kind: PremadeKind, cpus: set[int]) -> Launch:
        launch = premake(kind, cpus)  # its record and cgroups are there, its helper started
        made.set()
        go_on.wait(10)  # a launch the host is slow to finish (the kernel making its namespaces, under load)
        return launch

    monkeypatch.setattr(own.launcher, "premake", slow_premake)
    own.premade.want(KIND, 1)
    assert await asyncio.to_thread(made.wait, 10)
    threading.Timer(0.3, go_on.set).start()
    await own.close_all()
    assert _leftovers(own) == ([], [], [])


async def test_other_limits_get_a_full_launch_and_the_network_one_made_ahead(own: BwrapProvider) -> None:
    own.premade.want(KIND, 1)
    await own.premade.wait_full()
    (ready,) = own.premade.idle[KIND]
    async with await own.create(SandboxSpec(ttl_s=60, memory_mb=512)) as other:
        assert other.id != ready.sid
    assert list(own.premade.idle[KIND]) == [ready]
    # Every sandbox has a namespace of its own: the network (slirp4netns) comes after the launch.
    async with await own.create(SandboxSpec(ttl_s=60, memory_mb=300, pids=200, network=True)) as networked:
        assert networked.id == ready.sid
        devices = await networked.exec("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | sort")
        assert devices.stdout.split() == ["lo", "tap0"]


def test_a_dead_providers_launches_end_and_are_reaped(tmp_path: Path) -> None:
    state = tmp_path / "state"
    ids = kill_9_after_first_line(
        f"""
        import asyncio
        from sandrl.sandbox.base import SandboxSpec
        from sandrl.sandbox.bwrap import BwrapProvider, premade
        from sandrl.sandbox.bwrap.launch import PremadeKind
        async def main():
            p = BwrapProvider({str(state)!r})
            p.premade.want(PremadeKind.of(SandboxSpec()), 3)
            await p.premade.wait_full()
            print(" ".join(f"{{l.sid}}:{{l.slot.uid}}" for q in p.premade.idle.values() for l in q), flush=True)
            await asyncio.sleep(1000)
        asyncio.run(main())
        """
    ).split()
    assert len(ids) == 3
    uids = {int(made.split(":")[1]) for made in ids}
    ids = [made.split(":")[0] for made in ids]
    reaped: set[str] = set()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not set(ids) <= reaped:  # the helpers see their sockets close and exit
        fresh = BwrapProvider(state)
        reaped |= set(fresh.reaped)
        time.sleep(0.1)
    assert set(ids) <= reaped
    assert _leftovers(BwrapProvider(state), uids) == ([], [], [])


async def test_an_argument_with_a_nul_byte_never_reaches_a_waiting_helper(own: BwrapProvider) -> None:
    own.premade.want(KIND, 1)
    await own.premade.wait_full()
    launch = own.premade.take(KIND, os.sched_getaffinity(0))
    assert launch is not None and launch.proc is not None
    plan = own.images.get(SPEC.image).plan
    hostile = type(plan)(layers=(Path("/tmp/x\0--bind"), *plan.layers), overlays=plan.overlays)
    with pytest.raises(ValueError, match="NUL byte"):
        await asyncio.to_thread(own.launcher.finish, launch, SPEC, hostile)
    assert launch.proc.wait(timeout=5) is not None  # undone: its helper ended, nothing was sent
    assert not own.state.record_dir(launch.sid).exists()


async def test_a_launch_made_ahead_is_filtered_before_it_is_taken(own: BwrapProvider) -> None:
    """Pid 1 installs the seccomp filter and drops its bounding set while it waits for a root (~0.2 ms
    of each fork child's start, off the fork's path); the agent it execs keeps that one filter."""
    own.premade.want(KIND, 1)
    await own.premade.wait_full()
    proc = own.premade.idle[KIND][0].proc
    assert proc is not None
    deadline = time.monotonic() + 5
    status: dict[str, str] = {}
    while time.monotonic() < deadline:  # pid 1 stages /proc and /dev, then installs it and waits
        with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
            children = f.read().split()
        if children:
            with open(f"/proc/{children[0]}/status") as f:
                status = dict(line.split(":\t", 1) for line in f.read().splitlines() if ":\t" in line)
            if status.get("Seccomp") == "2":
                break
        await asyncio.sleep(0.01)
    assert status.get("Seccomp") == "2" and status.get("Seccomp_filters") == "1", status
    assert int(status["CapBnd"], 16) == 0x00000000A80425FB  # Docker's 14 capabilities, as bubblewrap leaves them
    async with await own.create(SPEC) as sandbox:
        out = (await sandbox.exec("grep -E '^(Seccomp|Seccomp_filters|CapBnd):' /proc/1/status")).stdout
    assert out.split() == ["CapBnd:", "00000000a80425fb", "Seccomp:", "2", "Seccomp_filters:", "1"]


async def test_an_undone_launch_whose_cgroups_stay_keeps_its_record(own: BwrapProvider) -> None:
    """A launch undone while its cgroups could not be removed in time (a process stuck in the kernel)
    keeps its record: the next reaper and `sandrl sandbox ls` see a dead sandbox, not a stray group."""
    launch = await asyncio.to_thread(own.launcher.premake, KIND, os.sched_getaffinity(0))
    assert launch.group is not None
    group = launch.group
    object.__setattr__(group, "remove", lambda timeout_s=10.0: False)  # the kernel kept a process
    await asyncio.to_thread(launch.undo)
    assert launch.sid in own.state.records()
    del group.remove  # the real removal, as the reaper does it
    assert group.remove()
    own.state.remove_record(launch.sid)


async def test_a_close_cancelled_while_it_waits_leaves_the_pool_usable(
    own: BwrapProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pool's close cancelled while it waits for an undo (a run's second Ctrl-C) left it closed
    for good: a later fork's ``want`` did nothing, and no launch was made ahead again."""
    made, go_on = threading.Event(), threading.Event()
    premake = own.launcher.premake

    def slow_premake(kind: PremadeKind, cpus: set[int]) -> Launch:
        launch = premake(kind, cpus)
        made.set()
        go_on.wait(10)
        return launch

    monkeypatch.setattr(own.launcher, "premake", slow_premake)
    own.premade.want(KIND, 1)
    assert await asyncio.to_thread(made.wait, 10)
    closing = asyncio.create_task(own.premade.close())
    await asyncio.sleep(0.1)  # waiting for the launch being made, to undo it
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    go_on.set()
    own.premade.want(KIND, 1)
    await own.premade.wait_full(timeout_s=10)
    assert len(own.premade.idle.get(KIND, ())) == 1
