"""Which task each data position of a training run draws, from one task set or from several mixed by weight.

A run consumes its tasks by data position ``p`` (:mod:`sandrl.train.group_sources`). From one task
set, ``p`` is the ``p``-th draw of a seeded shuffle per pass over its tasks. From several sources
(``[[tasks.sources]]``), position ``p`` first draws its source, with probability
``weight / sum(weight)`` over the sources that have not run out (one stream seeded by ``[run]
seed``, drawn in position order), then takes that source's next task from the source's own seeded
shuffle per pass. Everything follows from the seed and the position: a resumed run, and a cluster
run's driver, draw the same task at the same position.

A source with ``epochs = N`` runs out once each of its tasks was drawn ``N`` times; its weight then
goes to the sources still drawing, in proportion to theirs. When every source has run out the mix
has no more positions (:attr:`TaskMix.limit`) and the run stops there.
"""

from __future__ import annotations

import bisect
import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from sandrl.tasks.task import Task


def shuffle_key(seed: int, source: str = "") -> str:
    """The seed string of a task set's shuffles: a run's only task set keeps the key runs have always had."""
    return f"sandrl.train:{seed}:{source}" if source else f"sandrl.train:{seed}"


@lru_cache(maxsize=64)
def pass_order(key: str, epoch: int, count: int) -> tuple[int, ...]:
    """The order of ``count`` tasks in pass ``epoch`` of the shuffles seeded by ``key``."""
    order = list(range(count))
    random.Random(f"{key}:{epoch}").shuffle(order)
    return tuple(order)


def drawn_in_pass(tasks: Sequence[Task], key: str, draw: int) -> Task:
    """The task of the ``draw``-th draw from ``tasks``: each pass over them is a new shuffle seeded by ``key``."""
    epoch, index = divmod(draw, len(tasks))
    return tasks[pass_order(key, epoch, len(tasks))[index]]


@dataclass(frozen=True)
class MixSource:
    """One source of a mix: its name, weight, tasks, and how many passes over them it gives (0: no end)."""

    name: str
    weight: float
    tasks: tuple[Task, ...]
    epochs: int = 0

    @property
    def draws(self) -> int | None:
        """Draws before the source runs out; None: it never does."""
        return self.epochs * len(self.tasks) if self.epochs else None


class TaskMix:
    """The task at each data position (see the module); positions are drawn once, in order, and remembered."""

    def __init__(self, sources: Sequence[MixSource], seed: int) -> None:
        if not sources or any(not s.tasks for s in sources):
            raise ValueError("a mix needs at least one source, each with tasks")
        self.sources = tuple(sources)
        self.seed = seed
        single = len(self.sources) == 1
        self._keys = [shuffle_key(seed, "" if single else s.name) for s in self.sources]
        self._rng = random.Random(f"sandrl.mix:{seed}")
        self._picks: list[int] = []
        """The source of each position drawn so far."""
        self._draws: list[int] = []
        """Each position's draw number within its source."""
        self._taken = [0] * len(self.sources)
        self._last: dict[int, int] = {}
        """A source that ran out: the position of its last draw."""
        draws = [s.draws for s in self.sources]
        self.limit: int | None = None if None in draws else sum(d for d in draws if d is not None)
        """Positions in all (None: unbounded): every source has an ``epochs``."""

    @property
    def mixed(self) -> bool:
        """More than one source: the run's metrics are split by source."""
        return len(self.sources) > 1

    @property
    def tasks(self) -> list[Task]:
        """Every task of every source."""
        return [t for s in self.sources for t in s.tasks]

    def first_pass(self) -> list[Task]:
        """Every task once, in the order the run first draws it (a source's tasks not drawn within as many
        positions as there are tasks follow, in its first pass's order): the order to fetch images in."""
        seen: dict[str, Task] = {}
        count = len(self.tasks) if self.limit is None else min(len(self.tasks), self.limit)
        for task in map(self.task_at, range(count)):
            seen.setdefault(task.id, task)
        for source, key in zip(self.sources, self._keys, strict=True):
            for draw in range(len(source.tasks)):
                task = drawn_in_pass(source.tasks, key, draw)
                seen.setdefault(task.id, task)
        return list(seen.values())

    def task_at(self, position: int) -> Task:
        source, draw = self._at(position)
        return drawn_in_pass(self.sources[source].tasks, self._keys[source], draw)

    def source_at(self, position: int) -> MixSource:
        return self.sources[self._at(position)[0]]

    def ran_out_at(self, name: str) -> int | None:
        """The position of the last draw of the source ``name``, once the mix has drawn that far."""
        index = next(i for i, s in enumerate(self.sources) if s.name == name)
        return self._last.get(index)

    def _at(self, position: int) -> tuple[int, int]:
        if position < 0 or (self.limit is not None and position >= self.limit):
            raise IndexError(f"data position {position} is outside the mix's {self.limit} positions")
        if not self.mixed:
            if self.limit is not None and position == self.limit - 1:
                self._last[0] = position
            return 0, position
        while len(self._picks) <= position:
            self._draw()
        return self._picks[position], self._draws[position]

    def _draw(self) -> None:
        live = [i for i, s in enumerate(self.sources) if s.draws is None or self._taken[i] < s.draws]
        if len(live) == 1:
            pick = live[0]
        else:
            bounds = list(itertools.accumulate(self.sources[i].weight for i in live))
            at = bisect.bisect_right(bounds, self._rng.random() * bounds[-1])
            pick = live[min(at, len(live) - 1)]  # a float landing on the last bound
        position = len(self._picks)
        self._picks.append(pick)
        self._draws.append(self._taken[pick])
        self._taken[pick] += 1
        if self._taken[pick] == self.sources[pick].draws:
            self._last[pick] = position
