"""The model for faster inference: episode time, and the ratio between hosts, at k x faster.

``T(k) = model_s / k + (total_s - model_s)``: the model's share shrinks, the rest (commands,
verifier, sandbox create, the orchestrator) stays. :data:`ASSUMPTIONS` goes into every
report, since the numbers mean no more than they do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sandrl.bench.breakdown import EpisodeBreakdown
from sandrl.errors import ConfigError

SPEEDUPS: tuple[float, ...] = (1, 2, 4, 8, 16, 32)

ASSUMPTIONS: tuple[str, ...] = (
    "Model time scales as 1/k; every other phase (commands, verifier, sandbox create, setup, close) is unchanged.",
    "The phases of an episode are sequential: the agent waits for the model, then for the command.",
    "The sandbox host's load is the one measured: with faster inference more commands would run at once on "
    "the same host, so the CPU side is, if anything, underestimated (optimistic for the slower host).",
    "The breakdown is the mean episode of the run; the ratio compares mean episode times.",
    "KV idle fraction at k: decoding token-seconds scale as 1/k, idle token-seconds stay.",
)


def episode_time(b: EpisodeBreakdown, k: float) -> float:
    """The episode's time with inference ``k`` times faster."""
    if k <= 0:
        raise ConfigError(f"an inference speed-up must be positive, got {k}")
    return b.model_s / k + (b.total_s - b.model_s)


def project(b: EpisodeBreakdown, speedups: Sequence[float] = SPEEDUPS) -> list[dict[str, float]]:
    """Per k: episode time, the model's and the rest's share, and the KV idle fraction."""
    out = []
    for k in speedups:
        t = episode_time(b, k)
        row = {
            "k": float(k),
            "episode_s": round(t, 4),
            "model_fraction": round(b.model_s / k / t, 4) if t > 0 else 0.0,
            "sandbox_fraction": round((t - b.model_s / k) / t, 4) if t > 0 else 0.0,
        }
        if b.kv is not None:
            row["kv_idle_fraction"] = round(b.kv.with_speedup(k).idle_fraction, 4)
        out.append(row)
    return out


def host_ratio(
    a: EpisodeBreakdown, b: EpisodeBreakdown, speedups: Sequence[float] = SPEEDUPS
) -> list[dict[str, float]]:
    """Per k: host B's episode time over host A's (> 1: B is slower)."""
    rows = []
    for k in speedups:
        ta, tb = episode_time(a, k), episode_time(b, k)
        rows.append({"k": float(k), "a_s": round(ta, 4), "b_s": round(tb, 4), "ratio": round(tb / ta, 4)})
    return rows


def projection_section(b: EpisodeBreakdown, speedups: Sequence[float] = SPEEDUPS) -> dict[str, Any]:
    """The ``projection`` part of a benchmark result."""
    return {"speedups": list(speedups), "points": project(b, speedups), "assumptions": list(ASSUMPTIONS)}
