"""Readings of the host shared for a moment: a burst of callers asking the kernel the same thing
(an admission check per create, hundreds a second) gets one answer a few milliseconds old, which
is as good a guard as a fresh one. Measurements (a benchmark's before and after) read fresh."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

__all__ = ["recent"]

T = TypeVar("T")

_taken: dict[Hashable, tuple[float, Any]] = {}


def recent(key: Hashable, read: Callable[[], T], max_age_s: float = 0.0) -> T:
    """``read()``, or the last result read for ``key`` if it is at most ``max_age_s`` old (0: read now)."""
    now = time.monotonic()
    if max_age_s > 0:
        taken, value = _taken.get(key, (float("-inf"), None))
        if now - taken <= max_age_s:
            return value  # type: ignore[no-any-return]
    value = read()
    _taken[key] = (now, value)
    return value
