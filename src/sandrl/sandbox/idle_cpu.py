"""How many of a host's cores sat idle just now, from the kernel's per-CPU tick counters.

Command admission (:class:`~sandrl.sandbox.admission.CommandAdmission`) asks it before it lets a
command run beyond the host's capacity: a capacity counts busy sandboxes, but a command does
not always keep its core busy (it waits on files, on the sandbox's start, on a child), and
while the episodes holding the slots sit in such waits, a waiting command can use the core
without slowing the others down.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from sandrl.errors import ConfigError

__all__ = ["IDLE_FIELDS", "IdleCpus", "cpu_counters"]

IDLE_FIELDS = (3, 4)
"""``idle`` and ``iowait`` among a ``cpuN`` line's counters (user nice system idle iowait ...)."""
_TOTAL_FIELDS = 8
"""user .. steal: ``guest`` and ``guest_nice`` are already counted in ``user`` and ``nice``."""


def cpu_counters(cpus: Iterable[int], path: str | os.PathLike[str] = "/proc/stat") -> list[list[int]]:
    """The tick counters of each ``cpuN`` line of ``path`` whose N is in ``cpus`` (user nice system idle ...)."""
    wanted = set(cpus)
    rows = []
    for line in Path(path).read_text().splitlines():
        name, _, rest = line.partition(" ")
        if name.startswith("cpu") and name != "cpu" and int(name[3:]) in wanted:
            rows.append([int(v) for v in rest.split()])
    return rows


class IdleCpus:
    """Idle cores among ``cpus`` over the last ``window_s`` seconds (or more, between calls).

    ``idle()`` re-reads ``/proc/stat`` once at least ``window_s`` passed since the last
    reading and returns the idle cores of that interval, else the last value: the kernel
    counts in ticks (100 a second per CPU), so a window much under 0.1 s would see a core
    as all busy or all idle. ``restart()`` starts a new interval and reports no idle core
    until it ends: after admitting a command, the next decision must see that command's load.
    """

    def __init__(
        self,
        *,
        window_s: float = 0.1,
        cpus: Iterable[int] | None = None,
        path: str | os.PathLike[str] = "/proc/stat",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not window_s > 0:
            raise ConfigError(f"the idle-CPU window must be positive, got {window_s}")
        self.window_s = window_s
        self.cpus = frozenset(os.sched_getaffinity(0) if cpus is None else cpus)
        if not self.cpus:
            raise ConfigError("IdleCpus needs at least one CPU to watch")
        self.path = Path(path)
        self._clock = clock
        self._idle = 0.0
        self._since = self._clock()
        self._ticks = self._read()

    def _read(self) -> tuple[int, int]:
        """(idle ticks, all ticks) summed over the watched CPUs."""
        idle = total = 0
        rows = cpu_counters(self.cpus, self.path)
        for counters in rows:
            idle += sum(counters[i] for i in IDLE_FIELDS if i < len(counters))
            total += sum(counters[:_TOTAL_FIELDS])
        if not rows:
            raise ConfigError(f"{self.path} lists none of the CPUs {sorted(self.cpus)}")
        return idle, total

    def idle(self) -> float:
        """Idle cores (0 .. ``len(cpus)``) in the last finished interval."""
        now = self._clock()
        if now - self._since >= self.window_s:
            ticks = self._read()
            d_idle, d_total = ticks[0] - self._ticks[0], ticks[1] - self._ticks[1]
            if d_total > 0:  # no tick yet (a fast clock or a coarse kernel): keep the last value
                self._idle = len(self.cpus) * d_idle / d_total
                self._since, self._ticks = now, ticks
        return self._idle

    def restart(self) -> None:
        """Forget the current interval: no idle core until a whole new window has passed."""
        self._idle = 0.0
        self._since = self._clock()
        self._ticks = self._read()
