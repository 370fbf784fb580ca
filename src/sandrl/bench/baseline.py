"""The standalone time a slowdown divides by: "this command alone on this host", measured so it means that.

Three things make a standalone time taken once, at the start, on an idle virtual machine
mean something else:

- **drift**: a VM's speed moves over minutes (its neighbours on the physical host), so a
  baseline from minute 0 and a level at minute 4 differ for reasons that are not the load;
- **CPU state**: an idle vCPU halts and wakes slowly, so a command whose processes hop
  between cores is slower alone than with every core busy (the reason ``per-core slowdown
  at full load`` came out below 1);
- **small samples**: the median of 3 runs of a 70 ms command moves by 10-20%.

So the baseline here is measured in *passes* (every workload once, short ones several times),
alternating two CPU states, ``idle`` (nothing else running) and ``awake`` (every core kept
busy by :mod:`sandrl.bench.awake`'s ``SCHED_IDLE`` loops), a few at the start and one pair
again right before every load level after the first (the background paused), all pooled. A workload's
baseline is the faster of its two states' medians: the best this host does for it alone,
whichever state that is here (the loops cost a command in a sandbox 20-45% on the 2-vCPU
KVM box this was built on; where waking halted cores costs more, ``awake`` is the faster).
Both medians are kept in the result, with the drift between the first and last passes and
the spread (coefficient of variation) of each workload's runs: what :mod:`sandrl.bench.noise`
reads to diagnose a host too noisy to trust.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sandrl.bench import awake, noise, workloads
from sandrl.bench.workloads import Standalone, Workload
from sandrl.sandbox.bwrap import BwrapSandbox

State = Literal["idle", "awake"]
STATES: tuple[State, ...] = ("idle", "awake")
SHORT_S = 0.25
"""A pass runs a workload shorter than this several times, up to :data:`MAX_PER_PASS`, so the
short ones (git, pipelines) get the samples their spread needs at little cost."""
MAX_PER_PASS = 4


def runs_per_pass(warm_s: float) -> int:
    """How often one pass runs a workload that took ``warm_s`` in the warm-up."""
    if warm_s <= 0:
        return MAX_PER_PASS
    return max(1, min(MAX_PER_PASS, math.ceil(SHORT_S / warm_s)))


def cv(values: Sequence[float]) -> float:
    """Coefficient of variation (population stdev over mean); 0 for fewer than two."""
    if len(values) < 2:
        return 0.0
    mean = statistics.fmean(values)
    return statistics.pstdev(values) / mean if mean > 0 else 0.0


@dataclass
class Baseline:
    """Every standalone run so far, by state and workload, and what each pass saw."""

    workloads: Sequence[Workload]
    states: tuple[State, ...] = STATES
    per_pass: dict[str, int] = field(default_factory=dict)
    runs: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    passes: list[dict[str, Any]] = field(default_factory=list)
    spinner_group: Path | None = None
    spinner_cpu_s: float = 0.0
    """CPU the awake loops took over all the awake passes."""
    awake_wall_s: float = 0.0

    def __post_init__(self) -> None:
        self.runs = {s: {w.name: [] for w in self.workloads} for s in self.states}

    async def warm_up(self, sandbox: BwrapSandbox, rounds: int = 1, tick: Callable[[], None] = lambda: None) -> None:
        """Run each workload ``rounds`` times (caches, bytecode); size its runs per pass from the last."""
        for _ in range(max(1, rounds)):
            for w in self.workloads:
                self.per_pass[w.name] = runs_per_pass(await workloads.run(sandbox, w))
                tick()

    async def measure_pass(
        self, sandbox: BwrapSandbox, state: State, label: str, tick: Callable[[], None] = lambda: None
    ) -> None:
        """One pass in ``state``: every workload, each its runs per pass."""
        with awake.awake(state == "awake", group=self.spinner_group) as spinners:
            meter = noise.Meter(lambda: sandbox.stats().cpu_s + (spinners.cpu_s() if spinners else 0.0))
            for w in self.workloads:
                for _ in range(self.per_pass.get(w.name, 1)):
                    self.runs[state][w.name].append(await workloads.run(sandbox, w))
                tick()
            host: dict[str, Any] = meter.read()
            if spinners is not None:
                spun = spinners.cpu_s()
                self.spinner_cpu_s += spun
                self.awake_wall_s += host["wall_s"]
                host["spinner_cores"] = round(spun / host["wall_s"], 3) if host["wall_s"] > 0 else math.nan
        self.passes.append({"state": state, "label": label, **host})

    async def measure_pair(self, sandbox: BwrapSandbox, label: str, tick: Callable[[], None] = lambda: None) -> None:
        for state in self.states:
            await self.measure_pass(sandbox, state, label, tick)

    def median(self, state: State, name: str) -> float | None:
        runs = self.runs.get(state, {}).get(name)
        return statistics.median(runs) if runs else None

    def state_for(self, name: str) -> State:
        """The state whose median is the faster (the baseline's)."""
        medians = {s: m for s in self.states if (m := self.median(s, name)) is not None}
        return min(medians, key=lambda s: medians[s])

    def seconds(self, name: str) -> float:
        m = self.median(self.state_for(name), name)
        assert m is not None
        return m

    def idle_seconds(self, name: str) -> float:
        m = self.median("idle", name)
        return m if m is not None else self.seconds(name)

    def standalone(self) -> dict[str, Standalone]:
        """The chosen baseline as :class:`~sandrl.bench.workloads.Standalone` (median and runs)."""
        out = {}
        for w in self.workloads:
            state = self.state_for(w.name)
            out[w.name] = Standalone(w.name, w.cls, self.seconds(w.name), tuple(self.runs[state][w.name]))
        return out

    def drift(self, name: str) -> float | None:
        """The last third of a workload's idle runs over the first third, medians (1: no drift)."""
        runs = self.runs.get("idle", {}).get(name) or []
        third = len(runs) // 3
        if third < 1:
            return None
        first, last = statistics.median(runs[:third]), statistics.median(runs[-third:])
        return round(last / first, 4) if first > 0 else None

    def to_dict(self) -> dict[str, Any]:
        per_workload = {}
        for w in self.workloads:
            row: dict[str, Any] = {
                "class": w.cls,
                "state": self.state_for(w.name),
                "runs_per_pass": self.per_pass.get(w.name, 1),
            }
            for s in self.states:
                m = self.median(s, w.name)
                row[f"{s}_median_s"] = round(m, 5) if m is not None else None
                row[f"{s}_cv"] = round(cv(self.runs[s][w.name]), 4)
                row[f"{s}_n"] = len(self.runs[s][w.name])
            if "awake" in self.states and row.get("idle_median_s") and row.get("awake_median_s"):
                row["awake_over_idle"] = round(row["awake_median_s"] / row["idle_median_s"], 4)
            row["drift"] = self.drift(w.name)
            per_workload[w.name] = row
        return {
            "definition": "per workload, the faster of its idle-host and awake-host medians, pooled over passes "
            "at the start and before every level",
            "states": list(self.states),
            "awake_loops": {
                "policy": awake.POLICY,
                "group": str(self.spinner_group) if self.spinner_group is not None else None,
                "cpu_s": round(self.spinner_cpu_s, 3),
                "cores_taken": round(self.spinner_cpu_s / self.awake_wall_s, 3) if self.awake_wall_s > 0 else None,
            }
            if "awake" in self.states
            else None,
            "workloads": per_workload,
            "passes": self.passes,
        }


@contextlib.contextmanager
def spinner_group(cpu_base: Path | None) -> Iterator[Path | None]:
    """The awake loops' own cgroup beside the sandboxes' parent ``cpu_base``, removed after."""
    group = awake.make_group(cpu_base.parent, f"sandrl-awake-{os.getpid()}") if cpu_base is not None else None
    try:
        yield group
    finally:
        if group is not None:
            with contextlib.suppress(OSError):
                group.rmdir()
