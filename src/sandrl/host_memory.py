"""The host's memory as ``/proc/meminfo`` tells it: the one reader every part of sandrl uses.

Admission checks ask for ``MemAvailable`` on every create, and a burst of hundreds of creates
would read the file hundreds of times in a second (the kernel sums every zone for each read):
:func:`mem_available_bytes` takes a ``max_age_s`` so that those callers share a reading
(:func:`recent`, which the host's other readings shared for a moment use too: its pressure, the
egress rules' resolvers and addresses). Measurements (a benchmark's before and after) read fresh.
"""

from __future__ import annotations

import ctypes
import functools
import time
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

__all__ = [
    "ADMISSION_MEMORY_AGE_S",
    "mem_available_bytes",
    "meminfo_kb",
    "process_memory_bytes",
    "recent",
    "release_freed_memory",
]

T = TypeVar("T")

_taken: dict[Hashable, tuple[float, Any]] = {}


def recent(key: Hashable, read: Callable[[], T], max_age_s: float = 0.0) -> T:
    """``read()``, or the last result read for ``key`` if it is at most ``max_age_s`` old (0: read now): a
    burst of callers asking the kernel the same thing gets one answer a few milliseconds old."""
    now = time.monotonic()
    if max_age_s > 0:
        taken, value = _taken.get(key, (float("-inf"), None))
        if now - taken <= max_age_s:
            return value  # type: ignore[no-any-return]
    value = read()
    _taken[key] = (now, value)
    return value


ADMISSION_MEMORY_AGE_S = 0.05
"""How old a reading an admission check accepts: a burst's creates share one."""


def meminfo_kb(key: str) -> int | None:
    """The value of ``key`` (``MemTotal``, ``MemAvailable``, ...) in KiB, or None if the host does not say."""
    prefix = key + ":"
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(prefix):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def mem_available_bytes(max_age_s: float = 0.0) -> int | None:
    """``MemAvailable`` in bytes, read at most ``max_age_s`` ago (0: read now); None if unknown."""
    return recent("MemAvailable", _mem_available_bytes, max_age_s)


def _mem_available_bytes() -> int | None:
    kb = meminfo_kb("MemAvailable")
    return None if kb is None else kb * 1024


def process_memory_bytes(pid: int | None = None) -> tuple[int, int] | None:
    """A process's resident memory now and its peak (``VmRSS``, ``VmHWM``), in bytes; None if unknown.

    ``pid``: this process when None."""
    values: dict[str, int] = {}
    try:
        with open(f"/proc/{'self' if pid is None else pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    values[line[:5]] = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    if "VmRSS" not in values or "VmHWM" not in values:
        return None
    return values["VmRSS"], values["VmHWM"]


def release_freed_memory() -> None:
    """Hand the pages this process has freed back to the kernel (glibc's ``malloc_trim``); a no-op elsewhere.

    glibc keeps what a thread frees in that thread's arena for the next allocation, and returns only
    what lies at the top of the heap. A trainer step's activations (hundreds of MiB of tensors below
    glibc's 32 MiB mmap threshold) are all freed by the end of the step, yet stay resident: the demo's
    driver held ~800 MiB free between steps, and as the batches' shapes varied the free holes grew
    it from 1.7 to 2.7 GB over 80 steps. Trimming after each step keeps the resident set at what is
    in use, for the price of faulting the next step's pages in again (a fraction of a step's
    forward and backward)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim: Callable[[int], int] | None = getattr(ctypes.CDLL(None), "malloc_trim", None)
    except OSError:  # no C library to open
        return None
    return trim  # None without glibc (musl has no malloc_trim)
