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
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider

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
