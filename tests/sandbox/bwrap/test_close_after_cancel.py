"""A provider closed right after creates were cancelled has undone them by the time its close returns.

A run stopped by a signal cancels its episodes, some of them mid-create, closes its provider and
exits. A cancelled create's launch goes on in a thread and is undone when it ends; before, nothing
waited for that, so the process could exit first and leave the launch's record and cgroups (and
its processes, until their socket closed) for the next provider's start to reap.
"""

from __future__ import annotations

import asyncio
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
