"""Slowdown statistics, the latency bar, and capacity: pure functions, no sandboxes.

*Slowdown* is a command's time under load divided by its standalone time. A load level
*passes* the bar when at least ``quantile`` of its commands (default 95%) have a slowdown of
at most ``bar`` (default 1.5x). *Capacity* is the largest load before the first failing
level: the sweep measures a grid of loads, then bisection measures the whole-number loads
between the last passing grid level and the first failing one until they are adjacent.
Load is assumed to hurt monotonically; a passing level above a failing one (noise) does not
raise the capacity.

The pass rule is on the point estimate (the share within the bar, k of n probes, at least
``quantile``), which is what a small sample can honestly say; its uncertainty is reported
beside it, never hidden in the rule: each level's exact (Clopper-Pearson) interval for the
share (:func:`binomial_interval`; with 24 probes all within the bar the share is only known
to be above 0.86), and the capacity's own interval, from resampling each level's probes
(:func:`capacity_interval`). A small-sample p95 is no statistic to decide on: of 18 probes it
is their maximum.

What a run admits from a result (``capacity + 1`` commands at once) is :mod:`sandrl.capacity`'s.
"""

from __future__ import annotations

import math
import random
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


def binomial_interval(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) interval for a share of ``k`` in ``n``; (0, 1) for none."""
    if n <= 0:
        return (0.0, 1.0)
    if not 0 <= k <= n:
        raise ConfigError(f"a share needs 0 <= k <= n, got {k} of {n}")
    tail = (1.0 - confidence) / 2

    def cdf(x: int, p: float) -> float:  # P(X <= x), X ~ Binomial(n, p)
        if p <= 0.0:
            return 1.0
        if p >= 1.0:
            return 1.0 if x >= n else 0.0
        lp, lq = math.log(p), math.log1p(-p)
        return sum(
            math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq)
            for i in range(x + 1)
        )

    def solve(f: Callable[[float], float]) -> float:  # f decreasing in p from >0 to <0
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) > 0 else (lo, mid)
        return (lo + hi) / 2

    lower = 0.0 if k == 0 else solve(lambda p: tail - (1.0 - cdf(k - 1, p)))
    upper = 1.0 if k == n else solve(lambda p: cdf(k, p) - tail)
    return (round(lower, 4), round(upper, 4))


def share_section(slowdowns: Sequence[float], bar: float, quantile: float) -> dict[str, Any]:
    """The pass decision of one level with its uncertainty: k of n within, the interval, the verdict.

    ``clear`` is whether the interval lies wholly on one side of ``quantile``: with few probes a
    pass is never clear (all of 24 within still leaves 0.86 possible); a clear fail is.
    """
    n = len(slowdowns)
    k = sum(1 for s in slowdowns if s <= bar)
    lo, hi = binomial_interval(k, n)
    passed = passes(slowdowns, bar, quantile)
    return {
        "within": k,
        "n": n,
        "share": round(k / n, 4) if n else math.nan,
        "interval": [lo, hi],
        "passed": passed,
        "clear": lo >= quantile if passed else hi < quantile,
    }


def capacity_interval(
    samples: Mapping[int, Sequence[float]],
    bar: float,
    quantile: float,
    *,
    resamples: int = 2000,
    coverage: float = 0.9,
    seed: int = 0,
) -> dict[str, Any]:
    """How sure the capacity is: each level's probes resampled with replacement, the pass rule and
    :func:`capacity_from` applied to every resample.

    Returns the ``coverage`` interval of the capacity (``low``/``high``; None: even idle failed)
    and how often each capacity came out (``distribution``). Deterministic for a ``seed``.
    """
    if not samples or any(not v for v in samples.values()):
        raise ConfigError("the capacity interval needs probes at every level")
    rng = random.Random(seed)
    loads = sorted(samples)
    counts: dict[int, int] = {}
    for _ in range(resamples):
        results = {}
        for load in loads:
            values = samples[load]
            draw = [values[rng.randrange(len(values))] for _ in values]
            results[load] = passes(draw, bar, quantile)
        cap = capacity_from(results)
        key = -1 if cap is None else cap
        counts[key] = counts.get(key, 0) + 1
    ordered = sorted(counts)
    tail = (1.0 - coverage) / 2 * resamples

    def at(rank: float) -> int | None:
        seen = 0
        for c in ordered:
            seen += counts[c]
            if seen > rank:
                return None if c < 0 else c
        return None if ordered[-1] < 0 else ordered[-1]

    return {
        "low": at(tail),
        "high": at(resamples - tail - 1),
        "coverage": coverage,
        "resamples": resamples,
        "distribution": {("none" if c < 0 else str(c)): round(counts[c] / resamples, 4) for c in ordered},
    }


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
    grid: Sequence[int],
    evaluate: Callable[[int, str], Awaitable[bool]],
    *,
    bisect: bool = True,
    past_failure: int | None = None,
    through: int = 0,
    clear: Callable[[int], bool] = lambda load: True,
) -> Capacity:
    """Measure the grid's loads, then bisect.

    ``evaluate(load, source)`` measures one load and says whether it passed the bar; it is
    called once per load, the grid's in ascending order (source ``sweep``), then the
    bisection's (source ``bisect``). ``past_failure``: measure only this many grid loads above
    the first failing one (they cannot change the capacity, only draw the curve); None, all.
    Loads up to ``through`` are measured whatever fails (the full-load level, say). Only a
    failure that ``clear(load)`` says is clear stops the sweep early: a marginal one may turn
    into a pass once the verdicts are made again against a better baseline.
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

    beyond = 0
    for load in sorted(set(grid)):
        failed = any(not ok and clear(n) for n, ok in results.items())
        if failed and load > through and past_failure is not None:
            if beyond >= past_failure:
                break
            beyond += 1
        await measure(load, "sweep")
    lo = capacity_from(results)
    above = [n for n in sorted(results) if lo is not None and n > lo]
    if lo is not None and above:
        hi = above[0]
        while bisect and hi - lo > 1:
            mid = (lo + hi) // 2
            if await measure(mid, "bisect"):
                lo = mid
            else:
                hi = mid
    return settle(results, evaluated)


def settle(results: Mapping[int, bool], evaluated: Sequence[dict[str, Any]] = ()) -> Capacity:
    """The capacity that measured loads' pass/fail say (also after they were re-judged)."""
    if not results:
        raise ConfigError("no load was measured")
    lo = capacity_from(results)
    if lo is None:
        return Capacity(None, "none", (-1, min(results)), list(evaluated))
    above = [n for n in sorted(results) if n > lo]
    if not above:
        return Capacity(lo, "lower", (lo, None), list(evaluated))
    hi = above[0]
    return Capacity(lo, "exact" if hi - lo == 1 else "lower", (lo, hi), list(evaluated))
