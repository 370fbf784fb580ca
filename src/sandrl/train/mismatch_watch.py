"""Whether the inference engine and the trainer still agree: the step line says when they stop.

Every step measures the mismatch between the engine's log-probs and the trainer's for the same
tokens (``train/mismatch_kl``, :mod:`sandrl.train.diagnostics`). It is small and steady while the
two compute the same policy; it jumps when they do not (weights that did not load, a kernel or
precision change, samples far more stale than before), and a run that trains on such samples
degrades a few steps later. :class:`MismatchWatch` says so on the step where it jumps, with the
cause (staleness, stop reason) where the mismatch is largest.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

JUMP = 4.0
"""A step's mismatch this many times the recent median is a jump."""
FLOOR = 1e-3
"""Mismatches below this (nats per token) are noise, whatever the ratio."""
HISTORY = 10
"""Steps the recent median is taken over."""
MIN_HISTORY = 3
"""Steps seen before a jump can be told."""


@dataclass
class MismatchWatch:
    """The recent mismatches of a run; :meth:`observe` tells a jump."""

    recent: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))

    def observe(self, metrics: Mapping[str, object]) -> str:
        """What the step's line adds (empty unless the mismatch jumped); ``metrics`` is the step's record."""
        value = metrics.get("train/mismatch_kl")
        if not isinstance(value, int | float):
            return ""
        current = float(value)
        suffix = ""
        if len(self.recent) >= MIN_HISTORY:
            median = statistics.median(self.recent)
            if current > FLOOR and current > JUMP * max(median, FLOOR / JUMP):
                suffix = f"  mismatch KL jumped to {current:.3g} (recent {median:.3g}){_worst(metrics)}"
        self.recent.append(current)
        return suffix


def _worst(metrics: Mapping[str, object]) -> str:
    """``, most in <cause> (<value>)``: the cause whose tokens disagree most."""
    by_cause = {
        key.removeprefix("train/").removesuffix("/mismatch_kl"): float(value)
        for key, value in metrics.items()
        if key.startswith("train/") and key.endswith("/mismatch_kl") and isinstance(value, int | float)
    }
    if not by_cause:
        return ""
    cause = max(by_cause, key=lambda k: by_cause[k])
    return f", most in {cause} ({by_cause[cause]:.3g}): check the weights the engine serves"
