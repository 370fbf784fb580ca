"""A task mix's numbers in each step's record: per source, the step's episodes and the run's realised mix.

With ``[[tasks.sources]]`` (:mod:`sandrl.wiring.task_mix`), every step's line of ``metrics.jsonl``
has, for each source ``<name>``:

- ``source/<name>/groups``, ``source/<name>/episodes``: the step's, from that source;
- ``source/<name>/reward_mean`` (over its verified episodes) and ``source/<name>/pass_rate`` (over all
  its episodes), when the step had any of them;
- ``source/<name>/weight``: its share of the weights, as configured; ``source/<name>/share``: its share
  of the groups the run has done so far (trained, or dropped as too stale), ``source/<name>/groups_total``
  those groups. The run's last line, which ``sandrl train`` prints as its result, thus holds the mix as
  it was realised;
- ``source/<name>/ran_out``, for a source with ``epochs``: 1 once its last group is done, else 0.

A source that runs out is said once on the console (when its last group is done), as is the end of
the mix (when every source has run out and every group is done).
A resumed run counts from data position 0 (the mix draws the same sources again), so its shares are
the whole run's, and says nothing again of a source that ran out before the checkpoint.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass, field

from rich.console import Console

from sandrl.rollout.runner import Group
from sandrl.wiring.task_mix import TaskMix


@dataclass
class MixReport:
    """The per-source numbers of a mix, step by step (see the module)."""

    mix: TaskMix
    console: Console
    _counted: int = 0
    """Positions below this one are counted in ``_below``."""
    _below: collections.Counter[str] = field(default_factory=collections.Counter)
    _said: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, mix: TaskMix, console: Console, low: int, consumed: set[int]) -> MixReport | None:
        """The report of ``mix`` (None for one task set that never runs out), from a run's resumed data position."""
        if not mix.mixed and mix.limit is None:
            return None
        report = cls(mix, console)
        report._count_below(low)
        report._said = {s.name for s in mix.sources if report._ran_out(s.name, low, consumed)}
        if mix.limit is not None and low >= mix.limit:
            report._said.add("")  # the end of the mix, said before the resume
        return report

    def step(self, items: Sequence[tuple[int, Group]], low: int, consumed: set[int]) -> dict[str, float]:
        """The per-source metrics of a step of ``items`` (positions and groups), the run's done positions
        being those below ``low`` and ``consumed``; says on the console which sources ran out."""
        self._count_below(low)
        done = self._below + collections.Counter(self.mix.source_at(p).name for p in consumed)
        total = sum(done.values())
        groups: dict[str, list[Group]] = collections.defaultdict(list)
        for position, group in items:
            groups[self.mix.source_at(position).name].append(group)
        weights = sum(s.weight for s in self.mix.sources)
        ran_out = [s.name for s in self.mix.sources if s.epochs and self._ran_out(s.name, low, consumed)]
        out: dict[str, float] = {}
        for source in self.mix.sources:
            key = f"source/{source.name}/"
            episodes = [t for g in groups[source.name] for t in g.trajectories]
            verified = [t.reward for t in episodes if t.reward is not None and t.status != "infra_error"]
            out[key + "groups"] = len(groups[source.name])
            out[key + "episodes"] = len(episodes)
            if verified:
                out[key + "reward_mean"] = sum(verified) / len(verified)
            if episodes:
                out[key + "pass_rate"] = sum(bool(t.passed) for t in episodes) / len(episodes)
            out[key + "weight"] = source.weight / weights
            out[key + "groups_total"] = done[source.name]
            out[key + "share"] = done[source.name] / total if total else 0.0
            if source.epochs:
                out[key + "ran_out"] = float(source.name in ran_out)
        for name in ran_out:
            if name not in self._said:
                self._said.add(name)
                self._say_ran_out(name, [s.name for s in self.mix.sources if s.name not in ran_out])
        if self.mix.limit is not None and "" not in self._said and low >= self.mix.limit:
            self._said.add("")
            self._say(
                f"every source of [[tasks.sources]] has run out, after {self.mix.limit} groups: the run has no "
                "more tasks and ends with this step (raise a source's epochs, or set it to 0, to train on)"
            )
        return out

    def _count_below(self, low: int) -> None:
        for position in range(self._counted, low):
            self._below[self.mix.source_at(position).name] += 1
        self._counted = max(self._counted, low)

    def _ran_out(self, name: str, low: int, consumed: set[int]) -> bool:
        """Whether the last group of source ``name`` is done."""
        last = self.mix.ran_out_at(name)
        return last is not None and (last < low or last in consumed)

    def _say_ran_out(self, name: str, going: list[str]) -> None:
        source = next(s for s in self.mix.sources if s.name == name)
        then = f"the mix goes on with {', '.join(going)}" if going else "no source is left"
        self._say(
            f"source {name!r} ran out: each of its {len(source.tasks)} tasks was drawn {source.epochs} time(s) "
            f"([[tasks.sources]] epochs = {source.epochs}); {then}"
        )

    def _say(self, line: str) -> None:
        self.console.print(line, highlight=False, markup=False, soft_wrap=True)
