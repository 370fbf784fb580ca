"""A provider closed right after creates were cancelled has undone them by the time its close returns.

A run stopped by a signal cancels its episodes, some of them mid-create, closes its provider and
exits. A cancelled create's launch goes on in a thread and is undone when it ends; before, nothing
waited for that, so the process could exit first and leave the launch's record and cgroups (and
its processes, until their socket closed) for the next provider's start to reap.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider, protocol
from sandrl.sandbox.bwrap.images import MountPlan
from sandrl.sandbox.bwrap.launch import Launch

from ...support import REASON


@pytest.fixture
def own_provider(tmp_path: Path) -> Iterator[BwrapProvider]:
    """A provider of its own: its close must not close other tests' sandboxes."""
    if REASON is not None:
        pytest.skip(REASON)
    p = BwrapProvider(tmp_path / "state")
    yield p
    p._close_all_sync()


async def test_close_all_waits_for_the_undo_of_creates_cancelled_mid_launch(own_provider: BwrapProvider) -> None:
    provider = own_provider
    async with await provider.create(SandboxSpec()) as warm:  # the image and the helper are ready
        await warm.exec("true")
    for _ in range(3):
        creates = [asyncio.create_task(provider.create(SandboxSpec())) for _ in range(6)]
        await asyncio.sleep(0)  # each is now in its launch's thread
        for task in creates:
            task.cancel()
        await asyncio.gather(*creates, return_exceptions=True)
        await provider.close_all()
        # Nothing waited for: what the launches made is gone once close_all returns.
        assert provider.state.records() == []
        assert _groups_left(provider) == {}


def _groups_left(provider: BwrapProvider) -> dict[str, list[str]]:
    """The provider's sandbox groups still there, each with what it holds ("pid state wchan"): a group
    left with no record is most likely a removal that gave up on processes the kill had not ended yet (this
    test failed so once, under load, and that run did not say which)."""
    left: dict[str, list[str]] = {}
    for sid, dirs in provider.cgroups.stale_groups().items():
        pids = {pid for d in dirs for pid in _read(d / "cgroup.procs").split()}
        left[sid] = sorted(
            f"{pid} {_read(Path(f'/proc/{pid}/stat')).split(') ')[-1][:1]} {_read(Path(f'/proc/{pid}/wchan'))}"
            for pid in pids
        )
    return left


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return "?"


async def test_a_close_all_cancelled_while_it_waits_leaves_the_wait_to_the_next(
    own_provider: BwrapProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run's close interrupted (a second Ctrl-C) while it waits for the undo of a cancelled create:
    the wait's cancellation cancelled the undo's future itself, which dropped it from those the provider
    waits for, so the next ``close_all`` (the run's last, or the one at exit) returned before the
    launch was undone, its record and cgroups still there."""
    provider = own_provider
    await (await provider.create(SandboxSpec())).close()  # the image and the helper are ready
    made, go_on = threading.Event(), threading.Event()
    launch = provider.launcher.launch

    def slow_launch(sid: str, spec: SandboxSpec, plan: MountPlan, cpus: set[int]) -> Launch:
        started = launch(sid, spec, plan, cpus)  # its record and cgroups are there
        made.set()
        go_on.wait(10)  # a launch the host is slow to finish (under load)
        return started

    monkeypatch.setattr(provider.launcher, "launch", slow_launch)
    create = asyncio.create_task(provider.create(SandboxSpec()))
    assert await asyncio.to_thread(made.wait, 10)
    create.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await create
    closing = asyncio.create_task(provider.close_all())
    await asyncio.sleep(0.05)  # waiting for the undo
    closing.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await closing
    threading.Timer(0.3, go_on.set).start()
    await provider.close_all()
    assert provider.state.records() == []
    assert provider.cgroups.stale_groups() == {}


async def test_close_all_waits_for_the_undo_of_a_failed_create_whose_caller_was_cancelled(
    own_provider: BwrapProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A create that failed after its launch (here its agent speaks another protocol) undoes the launch
    while its caller waits; the caller cancelled meanwhile (a timeout, a run stopped) stopped waiting,
    and nothing else waited: ``close_all`` returned before the launch was undone."""
    provider = own_provider
    await (await provider.create(SandboxSpec())).close()  # the image and the helper are ready
    undoing, go_on = threading.Event(), threading.Event()
    undo = Launch.undo

    def slow_undo(launch: Launch) -> None:
        undoing.set()
        go_on.wait(10)  # a removal the host is slow to finish (under load)
        undo(launch)

    monkeypatch.setattr(Launch, "undo", slow_undo)
    monkeypatch.setattr(protocol, "PROTOCOL_VERSION", protocol.PROTOCOL_VERSION + 1)
    create = asyncio.create_task(provider.create(SandboxSpec()))
    assert await asyncio.to_thread(undoing.wait, 10)
    create.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await create
    threading.Timer(0.3, go_on.set).start()
    await provider.close_all()
    assert provider.state.records() == []
    assert provider.cgroups.stale_groups() == {}


def test_a_create_cancelled_as_its_loop_ends_is_undone_and_drops_nothing_running(own_provider: BwrapProvider) -> None:
    """A provider used from more than one event loop (``asyncio.run`` per call; a test suite's shared
    provider): the undo of a create cancelled as its loop ended was a task of that loop, cancelled
    with it, so the launch's helper was dropped running (a ResourceWarning when collected, as was
    its open socket) and its record and cgroups stayed."""
    provider = own_provider

    async def cancel_a_create_and_end() -> None:
        await (await provider.create(SandboxSpec())).close()  # the image and the helper are ready
        create = asyncio.create_task(provider.create(SandboxSpec()))
        await asyncio.sleep(0)  # now in its launch's thread
        create.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await create
        # The loop ends here, without the provider's close_all.

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        asyncio.run(cancel_a_create_and_end())
        # The launch goes on in its thread (its record may not even be written yet): wait for its undo.
        concurrent.futures.wait(list(provider._abandoned), timeout=10.0)
        gc.collect()
    assert provider.state.records() == []
    assert provider.cgroups.stale_groups() == {}
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []
