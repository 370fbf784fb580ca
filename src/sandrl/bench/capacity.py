"""Slowdown statistics, the latency bar, and capacity: pure functions, no sandboxes.

*Slowdown* is a command's time under load divided by its standalone time. A load level
*passes* the bar when at least ``quantile`` of its commands (default 95%) have a slowdown of
at most ``bar`` (default 1.5x). *Capacity* is the largest load before the first failing
level: the sweep measures a grid of loads, then bisection measures the whole-number loads
between the last passing grid level and the first failing one until they are adjacent.
Load is assumed to hurt monotonically; a passing level above a failing one (noise) does not
raise the capacity.

What a run admits from a result (``capacity + 1`` commands at once) is :mod:`sandrl.capacity`'s.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from sandrl.errors import ConfigError
from sandrl.stats import quantile as _quantile


def within_bar(slowdowns: Sequence[float], bar: float) -> float:
    """The fraction of commands with slowdown <= bar; nan for none."""
    if not slowdowns:
        return math.nan
    return sum(1 for s in slowdowns if s <= bar) / len(slowdowns)


def passes(slowdowns: Sequence[float], bar: float = 1.5, quantile: float = 0.95) -> bool:
    """At least ``quantile`` of the commands finished within ``bar`` times standalone."""
    return bool(slowdowns) and within_bar(slowdowns, bar) >= quantile - 1e-12


def summarize(slowdowns: Sequence[float], bar: float) -> dict[str, float]:
    """n, p50, p95, max and mean slowdown and the fraction within the bar."""
    return {
        "n": float(len(slowdowns)),
        "p50": round(_quantile(slowdowns, 0.5), 4),
        "p95": round(_quantile(slowdowns, 0.95), 4),
        "max": round(max(slowdowns), 4) if slowdowns else math.nan,
        "mean": round(sum(slowdowns) / len(slowdowns), 4) if slowdowns else math.nan,
        "within_bar": round(within_bar(slowdowns, bar), 4),
    }


def by_class(samples: Iterable[tuple[str, float]], bar: float) -> dict[str, dict[str, float]]:
    """Per class (and ``all``) :func:`summarize` of (class, slowdown) samples."""
    groups: dict[str, list[float]] = {}
    pooled: list[float] = []
    for cls, slowdown in samples:
        groups.setdefault(cls, []).append(slowdown)
        pooled.append(slowdown)
    out = {cls: summarize(values, bar) for cls, values in groups.items()}
    out["all"] = summarize(pooled, bar)
    return out


def default_levels(cores: float, quick: bool = False) -> tuple[int, ...]:
    """Background-task counts from idle to well past the core count.

    ``C - 1`` is always there: with the probe that makes every core busy (full load).
    """
    c = max(1, math.ceil(cores))
    wanted = {0, c - 1, c, 2 * c} if quick else {0, c // 2, c - 1, c, math.ceil(1.5 * c), 2 * c, 3 * c, 4 * c}
    return tuple(sorted(wanted))


def full_load_background(cores: float) -> int:
    """Background tasks at full load: with the probe, one busy sandbox per core."""
    return max(0, math.ceil(cores) - 1)


def capacity_from(results: Mapping[int, bool]) -> int | None:
    """The largest load below the first failing one; None when the lowest load fails.

    With no failure at all this is the largest load measured (a lower bound).
    """
    best: int | None = None
    for load in sorted(results):
        if not results[load]:
            return best
        best = load
    return best


@dataclass
class Capacity:
    load: int | None
    """Background tasks at capacity; None if even the lowest load failed the bar."""
    bound: Literal["exact", "lower", "none"]
    """``exact``: the next load up was measured and failed; ``lower``: no load failed, so the
    capacity is at least the highest load measured; ``none``: the lowest load failed."""
    bracket: tuple[int, int | None]
    """(last passing, first failing) loads; first failing None when none failed."""
    evaluated: list[dict[str, Any]] = field(default_factory=list)
    """Every load measured, in order: {"load", "passed", "source": "sweep" | "bisect"}."""

    def to_dict(self) -> dict[str, Any]:
        return {"load": self.load, "bound": self.bound, "bracket": list(self.bracket), "evaluated": self.evaluated}


async def find_capacity(
    grid: Sequence[int], evaluate: Callable[[int, str], Awaitable[bool]], *, bisect: bool = True
) -> Capacity:
    """Measure every grid load, then bisect.

    ``evaluate(load, source)`` measures one load and says whether it passed the bar; it is
    called once per load, the grid's in ascending order (source ``sweep``), then the
    bisection's (source ``bisect``).
    """
    if not grid or any(n < 0 for n in grid):
        raise ConfigError("the load grid needs at least one level, none negative")
    results: dict[int, bool] = {}
    evaluated: list[dict[str, Any]] = []

    async def measure(load: int, source: str) -> bool:
        ok = await evaluate(load, source)
        results[load] = ok
        evaluated.append({"load": load, "passed": ok, "source": source})
        return ok

    for load in sorted(set(grid)):
        await measure(load, "sweep")
    lo = capacity_from(results)
    if lo is None:
        return Capacity(None, "none", (-1, min(results)), evaluated)
    above = [n for n in sorted(results) if n > lo]
    if not above:
        return Capacity(lo, "lower", (lo, None), evaluated)
    hi = above[0]
    while bisect and hi - lo > 1:
        mid = (lo + hi) // 2
        if await measure(mid, "bisect"):
            lo = mid
        else:
            hi = mid
    return Capacity(lo, "exact" if hi - lo == 1 else "lower", (lo, hi), evaluated)
