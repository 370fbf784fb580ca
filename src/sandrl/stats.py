"""Small statistics: the runtime's summaries (rollout phase times, a host's latencies) and the benchmarks share them."""

from __future__ import annotations

import math
from collections.abc import Sequence


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile with linear interpolation (numpy's default); nan for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summary_ms(seconds: Sequence[float]) -> dict[str, float]:
    """p50/p95/p99/mean in milliseconds of durations given in seconds."""
    ms = [s * 1000 for s in seconds]
    return {
        "n": float(len(ms)),
        "p50_ms": round(quantile(ms, 0.50), 3),
        "p95_ms": round(quantile(ms, 0.95), 3),
        "p99_ms": round(quantile(ms, 0.99), 3),
        "mean_ms": round(sum(ms) / len(ms), 3) if ms else math.nan,
    }
