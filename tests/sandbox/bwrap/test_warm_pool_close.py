"""A warm pool closes even when the cancellation of its refill is lost inside a create.

Python 3.11's ``asyncio.wait_for`` (used while a sandbox starts) returns the result instead of
raising when the cancellation and the result arrive together; the pool's refill loop then went on
and waited forever for a change, and ``PooledProvider.close`` with it (tests/sandbox/bwrap/test_warm_pool.py
hung about one run in four).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, cast

from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap.warm_pool import PooledProvider


class FakeSandbox:
    def __init__(self) -> None:
        self.closed = False

    def add_close_callback(self, callback: Callable[[Any], None]) -> None:
        pass

    async def close(self) -> None:
        self.closed = True


class CancellationLosingProvider:
    """Its create finishes even when cancelled, as a create whose start raced the cancellation does."""

    def __init__(self) -> None:
        self.made: list[FakeSandbox] = []
        self.started = asyncio.Event()

    async def create(self, spec: SandboxSpec) -> FakeSandbox:
        self.started.set()
        with contextlib.suppress(asyncio.CancelledError):  # lost, as in asyncio.wait_for on 3.11
            await asyncio.sleep(0.2)
        self.made.append(FakeSandbox())
        return self.made[-1]


async def test_closing_a_pool_whose_create_loses_the_cancellation_ends() -> None:
    inner = CancellationLosingProvider()
    pooled = PooledProvider(cast(Any, inner), pools=[(SandboxSpec(), 1)])
    await inner.started.wait()
    await asyncio.wait_for(pooled.close(), 5)
    assert len(inner.made) == 1 and inner.made[0].closed  # the sandbox made meanwhile is not leaked
