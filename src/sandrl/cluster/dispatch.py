"""The driver side of the rollout workers: which worker runs each group, and what happens when one dies.

:class:`ClusterSource` is the :class:`~sandrl.train.group_sources.GroupSource` of a cluster run: data
position ``p`` is the same task as on one machine (the same seeded shuffle), its group id the same,
and :meth:`ClusterSource.group` sends it to the live worker with the fewest episodes in flight per
slot of its concurrency. If that worker dies (a Ray actor error), the group is re-issued (same
group id, so the same episode ids) to a live worker, at most ``max_reissues`` times; Ray restarts
the dead worker meanwhile (:class:`WorkerPool` waits for it to answer again). Each returned group
goes through the :class:`~sandrl.cluster.ledger.EpisodeLedger`, so no episode reaches the trainer
twice, and is appended to ``rollouts.jsonl`` here, on the driver.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayActorError

from sandrl.cluster.ledger import EpisodeLedger
from sandrl.errors import ClusterError
from sandrl.rollout.jsonl import TrajectoryWriter
from sandrl.rollout.runner import Group
from sandrl.tasks.task import Task
from sandrl.train.group_sources import group_id, task_at
from sandrl.wiring.task_mix import TaskMix

log = logging.getLogger(__name__)


async def _answer(ref: Any) -> Any:
    return await ref


@dataclass
class Member:
    """One rollout worker as the driver sees it."""

    index: int
    handle: Any
    share: int
    """Its episode slots (its RolloutRunner's concurrency)."""
    in_flight: int = 0
    """Episodes of groups handed to it and not back."""
    alive: bool = True
    losses: int = 0
    """Times a call to it failed because it died."""
    gone: bool = False
    """Dead for good (Ray's restarts are used up)."""
    reviving: asyncio.Task[None] | None = field(default=None, repr=False)


class WorkerPool:
    """The rollout workers, their load, and their deaths and restarts."""

    def __init__(self, handles: Sequence[Any], shares: Sequence[int], *, wait_s: float = 60.0) -> None:
        self.members = [Member(i, h, s) for i, (h, s) in enumerate(zip(handles, shares, strict=True))]
        self.wait_s = wait_s
        self._changed = asyncio.Event()

    def pick(self) -> Member | None:
        alive = [m for m in self.members if m.alive]
        return min(alive, key=lambda m: (m.in_flight / m.share, m.index)) if alive else None

    async def acquire(self) -> Member:
        """The least loaded live worker; waits for a restart while none is alive."""
        deadline = time.monotonic() + self.wait_s
        while True:
            member = self.pick()
            if member is not None:
                return member
            if all(m.gone for m in self.members):
                raise ClusterError("every rollout worker died and Ray will not restart them (max_restarts used up)")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ClusterError(
                    f"no rollout worker answered for {self.wait_s:g} s after they died; "
                    "check the Ray cluster (`ray status`) and the workers' logs"
                )
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=min(remaining, 1.0))

    def lost(self, member: Member, exc: BaseException) -> None:
        member.losses += 1
        if member.alive:
            log.warning("rollout worker %d died (%s); waiting for Ray to restart it", member.index, type(exc).__name__)
        member.alive = False
        if member.reviving is None or member.reviving.done():
            member.reviving = asyncio.ensure_future(self._revive(member))

    async def _revive(self, member: Member) -> None:
        """Ping the worker until Ray has restarted it; dead for good when it does not answer within ``wait_s``."""
        deadline = time.monotonic() + self.wait_s
        while time.monotonic() < deadline:
            try:
                await asyncio.wait_for(_answer(member.handle.pid.remote()), timeout=10)
            except (RayActorError, TimeoutError):
                await asyncio.sleep(0.2)
                continue
            member.alive = True
            log.warning("rollout worker %d is back", member.index)
            break
        else:
            member.gone = True
            log.warning("rollout worker %d did not come back within %g s", member.index, self.wait_s)
        self._changed.set()

    async def aclose(self) -> None:
        for member in self.members:
            if member.reviving is not None:
                member.reviving.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await member.reviving

    def to_dict(self) -> dict[str, Any]:
        return {
            "workers": len(self.members),
            "worker_losses": sum(m.losses for m in self.members),
            "workers_alive": sum(m.alive for m in self.members),
        }


@dataclass
class ClusterSource:
    """The groups of a cluster run; see the module docstring."""

    pool: WorkerPool
    tasks: Sequence[Task] | TaskMix
    run_id: str
    group_size: int
    seed: int = 0
    max_reissues: int = 3
    writer: TrajectoryWriter | None = None
    limit: int | None = None
    regenerates: bool = True
    ledger: EpisodeLedger = field(default_factory=EpisodeLedger)

    def task_at(self, position: int) -> Task:
        return task_at(self.tasks, self.seed, position)  # a cluster run draws the same tasks

    def group_id(self, position: int, regenerated: int = 0) -> str:
        return group_id(self.run_id, self.task_at(position), position, regenerated)

    async def group(self, position: int, group_id: str) -> Group:
        task = self.task_at(position)
        self.ledger.issue(group_id, self.group_size)
        while True:
            member = await self.pool.acquire()
            member.in_flight += self.group_size
            ref = member.handle.run_group.remote(task.id, group_id)
            try:
                group: Group = await ref
            except RayActorError as exc:
                self.pool.lost(member, exc)
                n = self.ledger.reissue(group_id)
                if n > self.max_reissues:
                    raise ClusterError(
                        f"group {group_id} was lost with its rollout worker {n} times (max_reissues "
                        f"{self.max_reissues}): {exc}"
                    ) from exc
                log.warning("re-issuing group %s (worker %d died)", group_id, member.index)
                continue
            except asyncio.CancelledError:
                ray.cancel(ref)  # the worker cancels the episodes, which close their sandboxes
                raise
            finally:
                member.in_flight -= self.group_size
            self.ledger.deliver(group)
            if self.writer is not None:
                self.writer.write_all(group.trajectories)
            return group
