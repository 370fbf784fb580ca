"""The async driver's bounded buffer: groups in flight or ready, never more than ``capacity``; staleness enforced.

:meth:`GroupBuffer.fill` keeps ``capacity`` groups rolling out or waiting (a slot is taken before
a group starts and given back when the trainer takes or drops it), so the rollout side runs at
most ``capacity`` groups ahead. :meth:`GroupBuffer.take` hands the trainer the oldest ready groups
whose staleness (the trainer's version minus the oldest version of any token in the group, judged
per token: :mod:`sandrl.train.staleness`) is at most ``max_staleness``; staler ones go to
:meth:`Session.stale` (dropped or regenerated). Once a finite source (a mix whose sources all have
``epochs``) is used up and its last groups are back, ``take`` hands over what is ready, fewer than
asked (none at the end), instead of waiting for groups that will never come.

Idle times: ``trainer_idle_s`` is how long ``take`` waited for groups; ``rollout_idle_s`` how long
``fill`` waited for a free slot (the buffer was full: the trainer is the bottleneck).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING

from sandrl.train.staleness import staleness

if TYPE_CHECKING:
    from sandrl.train.group_sources import Item
    from sandrl.train.session import Session


class GroupBuffer:
    """See the module docstring."""

    def __init__(self, capacity: int, max_staleness: int) -> None:
        self.capacity = capacity
        self.max_staleness = max_staleness
        self.in_flight = 0
        self.rollout_idle_s = 0.0
        self.trainer_idle_s = 0.0
        self._slots = asyncio.Semaphore(capacity)
        self._ready: list[Item] = []
        self._changed = asyncio.Event()
        self._error: BaseException | None = None
        self._used_up = False
        """The source has no more positions, and every group started is back."""
        self._tasks: set[asyncio.Task[Item]] = set()
        self._rollout_idle_since_take = 0.0

    def __len__(self) -> int:
        return len(self._ready)

    async def fill(self, session: Session) -> None:
        """Start a group whenever a slot is free; runs until cancelled (or the source is used up)."""
        try:
            while True:
                start = time.monotonic()
                await self._slots.acquire()
                waited = time.monotonic() - start
                self.rollout_idle_s += waited
                self._rollout_idle_since_take += waited
                position = session.next_position()
                if position is None:
                    self._slots.release()
                    # The source is used up: the groups in flight are what the trainer waits for, so
                    # they finish (the finally below would cancel them).
                    if self._tasks:
                        await asyncio.wait(set(self._tasks))
                    self._used_up = True
                    self._changed.set()
                    return
                self.in_flight += 1
                task = asyncio.ensure_future(session.rollout(position))
                self._tasks.add(task)
                task.add_done_callback(self._done)
        finally:
            for task in self._tasks:
                task.cancel()
            if self._tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.gather(*self._tasks, return_exceptions=True)

    def _done(self, task: asyncio.Task[Item]) -> None:
        self._tasks.discard(task)
        self.in_flight -= 1
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            self._error = error
        else:
            self._ready.append(task.result())
        self._changed.set()

    async def take(self, n: int, session: Session) -> tuple[list[Item], dict[str, float]]:
        """The oldest ``n`` ready groups within the staleness bound, and the buffer's metrics."""
        start = time.monotonic()
        while True:
            if self._error is not None:
                raise self._error
            self._prune(session)
            if len(self._ready) >= n or self._used_up:
                break
            self._changed.clear()
            await self._changed.wait()
        idle = time.monotonic() - start
        self.trainer_idle_s += idle
        fill = len(self._ready) / self.capacity
        items, self._ready = self._ready[:n], self._ready[n:]
        for _ in items:
            self._slots.release()
        stats = {
            "buffer_fill": fill,
            "in_flight": float(self.in_flight),
            "trainer_idle_s": idle,
            "rollout_idle_s": self._rollout_idle_since_take,
            "total_trainer_idle_s": self.trainer_idle_s,
            "total_rollout_idle_s": self.rollout_idle_s,
        }
        self._rollout_idle_since_take = 0.0
        return items, stats

    def _prune(self, session: Session) -> None:
        fresh: list[Item] = []
        for position, group in self._ready:
            if staleness(group, session.version) > self.max_staleness:
                self._slots.release()
                session.stale(position)
            else:
                fresh.append((position, group))
        self._ready = fresh
