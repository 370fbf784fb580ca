"""Is this host quiet enough to measure on, and if not, why: a one-line diagnosis.

A contention sweep whose idle level fails the bar has no capacity to report; the useful answer
is then *why* the host could not run a command within 1.5x of its own standalone time with
nothing else of ours running. The usual causes, each read from the run itself:

- **other work**: the host's CPUs were busier than our sandboxes, loops and process account
  for (``others_cores``, from ``/proc/stat`` against the cgroups' CPU time): other tenants;
- **steal**: the hypervisor ran something else on our vCPUs (``/proc/stat``'s steal column);
- **spread**: the standalone runs of a workload vary a lot (coefficient of variation);
- **drift**: the standalone times moved between the start and the end of the run;
- **frequency scaling**: the CPUs' frequency moved (where cpufreq is exposed; it is not on
  most VMs).

:class:`Meter` measures a stretch of the run; :func:`diagnose` turns the numbers into findings.
"""

from __future__ import annotations

import math
import resource
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sandrl.bench import hostinfo

OTHERS_CORES = 0.2
"""Cores of other work above which a host is not quiet."""
STEAL_SHARE = 0.03
SPREAD_CV = 0.15
DRIFT = 0.10
FREQ_SPREAD = 0.10


def _self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Meter:
    """What the host's CPUs did over a stretch, and how much of it was not ours.

    ``ours`` returns the CPU seconds our sandboxes (and the awake loops) have used so far; the
    benchmark's own process is counted too.
    """

    ours: Callable[[], float]
    start: hostinfo.CpuTimes = field(init=False)
    ours0: float = field(init=False)
    self0: float = field(init=False)

    def __post_init__(self) -> None:
        self.start, self.ours0, self.self0 = hostinfo.cpu_times(), self.ours(), _self_cpu_s()

    def read(self) -> dict[str, float]:
        host = hostinfo.cpu_times().since(self.start)
        wall = host["wall_s"]
        ours = self.ours() - self.ours0 + _self_cpu_s() - self.self0
        ours_cores = ours / wall if wall > 0 else math.nan
        return {
            **host,
            "ours_cores": round(ours_cores, 3),
            "others_cores": round(max(0.0, host["busy_cores"] - ours_cores), 3),
        }


@dataclass
class RunWatch:
    """The whole run: steal and frequency at its start and end."""

    start: hostinfo.CpuTimes = field(default_factory=hostinfo.cpu_times)
    freq0: dict[int, float] | None = field(default_factory=hostinfo.cpu_freq_mhz)
    load0: tuple[float, float, float] = field(default_factory=lambda: _loadavg())
    t0: float = field(default_factory=time.monotonic)

    def read(self) -> dict[str, Any]:
        freq1 = hostinfo.cpu_freq_mhz()
        freqs = [*(self.freq0 or {}).values(), *(freq1 or {}).values()]
        return {
            **hostinfo.cpu_times().since(self.start),
            "load_average_start": list(self.load0),
            "load_average_end": list(_loadavg()),
            "cpu_mhz": {"min": min(freqs), "max": max(freqs)} if freqs else None,
            "cpuidle_driver": hostinfo.cpuidle_driver(),
        }


def _loadavg() -> tuple[float, float, float]:
    import os

    one, five, fifteen = os.getloadavg()
    return (round(one, 2), round(five, 2), round(fifteen, 2))


def findings(
    *,
    idle_level: Mapping[str, Any] | None,
    baseline: Mapping[str, Any],
    run: Mapping[str, Any],
) -> list[str]:
    """What looks wrong with this host's measurements, most telling first; empty when quiet."""
    out: list[str] = []
    host = (idle_level or {}).get("host_cpu") or {}
    others = host.get("others_cores")
    if others is not None and others >= OTHERS_CORES:
        out.append(
            f"other work: {others:.2f} cores busy beyond ours during the idle level "
            f"(load average {run['load_average_start'][0]:g} at the start): the host is not quiet"
        )
    passes = [p for p in baseline.get("passes", []) if p.get("others_cores") is not None]
    if passes:
        worst = max(p["others_cores"] for p in passes)
        if worst >= OTHERS_CORES and not out:
            out.append(f"other work: up to {worst:.2f} cores busy beyond ours while measuring standalone")
    steal = run.get("steal_share", 0.0)
    if steal >= STEAL_SHARE:
        out.append(f"steal: the hypervisor took {steal:.1%} of the vCPUs' time")
    rows = list((baseline.get("workloads") or {}).values())
    spreads = [r.get(f"{r['state']}_cv", 0.0) for r in rows]
    if spreads and statistics.median(spreads) >= SPREAD_CV:
        out.append(
            f"spread: a workload's standalone runs vary by {statistics.median(spreads):.0%} (median coefficient "
            "of variation): the baseline itself is noisy"
        )
    drifts = [r["drift"] for r in rows if r.get("drift")]
    if drifts:
        far = max(drifts, key=lambda d: abs(d - 1))
        if abs(far - 1) >= DRIFT:
            out.append(f"drift: standalone times moved {far - 1:+.0%} between the first and last third of the run")
    mhz = run.get("cpu_mhz")
    if mhz and mhz["max"] > 0 and (mhz["max"] - mhz["min"]) / mhz["max"] >= FREQ_SPREAD:
        out.append(f"frequency scaling: the CPUs ran between {mhz['min']:.0f} and {mhz['max']:.0f} MHz")
    return out


def diagnosis(idle_level: Mapping[str, Any] | None, found: Sequence[str]) -> str | None:
    """One line for a run whose idle level failed (None when it passed)."""
    if idle_level is None or idle_level.get("passed"):
        return None
    share = idle_level["share"]
    head = (
        f"even the idle level failed ({share['within']} of {share['n']} probes within the bar, "
        f"p50 {idle_level['classes']['all']['p50']:.2f})"
    )
    if found:
        return f"{head}: {found[0]}" + (f"; also {'; '.join(found[1:])}" if len(found) > 1 else "")
    return (
        f"{head}, and no noise source was found (no other work, steal, spread or drift): the commands' own "
        "variance at this bar; raise --probes or loosen --bar"
    )


def explain_full_load(
    per_core: Mapping[str, float], idle_baseline: Mapping[str, float], found: Sequence[str]
) -> str | None:
    """Why a class ran faster with every core busy than alone, when one did (None otherwise)."""
    below = {c: v for c, v in per_core.items() if v < 1.0}
    if not below:
        return None
    parts = ", ".join(f"{c} {v:.2f}" for c, v in below.items())
    against_idle = ", ".join(f"{c} {idle_baseline[c]:.2f}" for c in below if c in idle_baseline)
    why = "; ".join(found) if found else "no noise source found: within the run-to-run spread of these commands"
    return (
        f"below 1 ({parts}): these commands ran faster at full load than alone. Against the idle-host baseline "
        f"alone: {against_idle}. Likely: {why}"
    )
