"""Where a run's groups come from, by data position: rollouts of the task at each position, or a
``--load-rollouts`` file.

Data position ``p`` is task ``order[p]`` (a seeded shuffle per pass over the tasks; with
``[[tasks.sources]]``, a mix's draw, :mod:`sandrl.wiring.task_mix`), or the ``p``-th group of a
``--load-rollouts`` file. The sync and async drivers' :class:`~sandrl.train.session.Session` and a
cluster run's dispatcher (:mod:`sandrl.cluster.dispatch`) draw from a :class:`GroupSource`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sandrl.errors import ConfigError
from sandrl.rollout.jsonl import iter_jsonl
from sandrl.rollout.runner import Group, RolloutRunner
from sandrl.tasks.task import Task
from sandrl.wiring.task_mix import TaskMix, drawn_in_pass, shuffle_key

Item = tuple[int, Group]
"""A group and its data position."""


class GroupSource(Protocol):
    """Where groups come from: rollouts, a file of saved ones, or rollout workers elsewhere (sandrl.cluster)."""

    limit: int | None
    """Positions available (None: unbounded)."""
    regenerates: bool
    """A too-stale group can be rolled out again (``async.on_stale = "regenerate"``)."""

    def group_id(self, position: int, regenerated: int = 0) -> str: ...

    async def group(self, position: int, group_id: str) -> Group: ...


def task_at(tasks: Sequence[Task] | TaskMix, seed: int, position: int) -> Task:
    """The task at a data position: a seeded shuffle per pass over the tasks, or a mix's draw (the mix is
    built on ``seed``); every driver, in process or on a cluster, draws the same order."""
    if isinstance(tasks, TaskMix):
        return tasks.task_at(position)
    return drawn_in_pass(tasks, shuffle_key(seed), position)


def group_id(run_id: str, task: Task, position: int, regenerated: int = 0) -> str:
    """The id of the group of ``task`` at ``position`` (``.rN`` for its N-th regeneration)."""
    suffix = f".r{regenerated}" if regenerated else ""
    return f"{run_id}/{task.id}#{position}{suffix}"


@dataclass
class RolloutSource:
    """Runs the group of the task at each data position (seeded shuffle per pass over the tasks)."""

    runner: RolloutRunner
    tasks: Sequence[Task] | TaskMix
    seed: int = 0
    limit: int | None = None
    regenerates: bool = True

    def task_at(self, position: int) -> Task:
        return task_at(self.tasks, self.seed, position)

    def group_id(self, position: int, regenerated: int = 0) -> str:
        return group_id(self.runner.run_id, self.task_at(position), position, regenerated)

    async def group(self, position: int, group_id: str) -> Group:
        return await self.runner.run_group(self.task_at(position), group_id)


@dataclass
class FileSource:
    """The groups of a ``--save-rollouts`` file, in the order their first episode appears."""

    groups: list[Group]
    limit: int | None = None
    regenerates: bool = False

    @classmethod
    def read(cls, path: str | Path) -> FileSource:
        if not Path(path).is_file():
            raise ConfigError(f"--load-rollouts {path}: no such file (it is written by a run with save_rollouts)")
        # A resumed run rolls out again, under the same group ids, the positions that were in flight
        # (or ready, in async mode) when the last one stopped: a sample index seen again in a group id
        # starts another group instead of doubling that one.
        latest: dict[str, list[Any]] = {}
        found: list[list[Any]] = []
        for trajectory in iter_jsonl(path):
            group = latest.get(trajectory.group_id)
            if group is None or any(t.sample_index == trajectory.sample_index for t in group):
                latest[trajectory.group_id] = group = []
                found.append(group)
            group.append(trajectory)
        groups = [Group(ts[0].group_id, ts[0].task_id, sorted(ts, key=lambda t: t.sample_index)) for ts in found]
        if not groups:
            raise ConfigError(f"--load-rollouts {path}: the file holds no trajectories")
        return cls(groups, limit=len(groups))

    def group_id(self, position: int, regenerated: int = 0) -> str:
        return self.groups[position].group_id

    async def group(self, position: int, group_id: str) -> Group:
        return self.groups[position]
