"""One sandbox host of a fleet: where it is, how much it can take, and what it has done.

A host's *capacity* is how many busy sandboxes it serves within the latency bar. It is either
configured (``capacity = 16``) or read from a ``sandrl bench contention`` result of that host
(``capacity_file``): the result's capacity is in *background* tasks, with the probe on top, so
the host serves ``capacity.load + 1`` busy sandboxes within the bar.

:class:`HostStats` is what the fleet counts per host: placements, failures, live sandboxes,
commands running, command latencies and command *slowdown*. Slowdown is measured without a
standalone run: a command's duration divided by the fastest duration of the same command text
anywhere in the fleet (:class:`Baselines`), so a host whose commands run slower than the same
commands elsewhere shows it. Commands shorter than :data:`SLOWDOWN_FLOOR_S` are left out: their
time is mostly noise.
"""

from __future__ import annotations

import collections
import hashlib
import math
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from sandrl.capacity import slots_from_file
from sandrl.errors import ConfigError
from sandrl.stats import quantile

SAMPLES_KEPT = 2048
"""Latency and slowdown samples kept per host (the newest)."""
SLOWDOWN_FLOOR_S = 0.02
"""Commands faster than this (at their fastest) give no slowdown sample."""


@dataclass(frozen=True)
class HostConfig:
    """A ``sandrl serve sandboxes`` host and its capacity (one ``[[cluster.hosts]]`` table)."""

    url: str
    """The service's base URL, e.g. ``http://10.0.0.2:8700``."""
    name: str = ""
    """A short label in metrics and sandbox ids; default ``host:port`` of the URL."""
    capacity: float | None = None
    """Busy sandboxes this host serves within the latency bar; or give ``capacity_file``."""
    capacity_file: str = ""
    """A ``sandrl bench contention --out`` result of this host: its capacity is ``load + 1``."""
    token_file: str = ""
    """File holding the service's bearer token, read where the provider runs; empty: ``$SANDRL_TOKEN``."""

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(f"sandbox host url must be http(s)://HOST:PORT, got {self.url!r}")
        if not self.name:
            object.__setattr__(self, "name", parts.netloc)
        if self.capacity is not None and self.capacity_file:
            raise ConfigError(f"host {self.name}: give capacity or capacity_file, not both")
        if self.capacity is not None and not (math.isfinite(self.capacity) and self.capacity > 0):
            raise ConfigError(f"host {self.name}: capacity must be a positive number, got {self.capacity!r}")

    def resolved(self) -> HostConfig:
        """The same host with ``capacity_file`` read into ``capacity`` (no capacity at all: 1)."""
        if self.capacity_file:
            cap = float(slots_from_file(self.capacity_file))
            return HostConfig(self.url, self.name, cap, "", self.token_file)
        if self.capacity is None:
            return HostConfig(self.url, self.name, 1.0, "", self.token_file)
        return self

    def load_token(self) -> str | None:
        if not self.token_file:
            return None
        from sandrl.sandbox.service.auth import load_token

        return load_token(self.token_file)


class Baselines:
    """The fastest duration seen of each command text, fleet-wide: the reference for slowdown."""

    def __init__(self, max_commands: int = 10_000) -> None:
        self._best: collections.OrderedDict[str, float] = collections.OrderedDict()
        self._max = max_commands

    def slowdown(self, command: str, duration_s: float) -> float | None:
        """Record ``duration_s`` of ``command``; its slowdown against the fastest run so far (None: too short)."""
        key = hashlib.blake2b(command.encode(), digest_size=12).hexdigest()
        best = self._best.get(key)
        if best is None or duration_s < best:
            best = duration_s
            self._best[key] = duration_s
        self._best.move_to_end(key)
        while len(self._best) > self._max:
            self._best.popitem(last=False)
        if best < SLOWDOWN_FLOOR_S:
            return None
        return duration_s / best


@dataclass
class HostStats:
    """What the fleet counts per host; :meth:`to_dict` is the metrics record."""

    placements: int = 0
    """Sandboxes created on the host."""
    failures: int = 0
    """Creates refused or broken, and sandboxes lost with the host."""
    down_events: int = 0
    """Times the host was taken out of placement."""
    live: int = 0
    """Sandboxes of this provider alive on the host."""
    running: int = 0
    """Commands of this provider running on the host."""
    commands: int = 0
    latencies: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=SAMPLES_KEPT))
    """Wall time of each exec call, transport included."""
    slowdowns: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=SAMPLES_KEPT))

    def to_dict(self) -> dict[str, Any]:
        lat, slow = list(self.latencies), list(self.slowdowns)
        return {
            "placements": self.placements,
            "failures": self.failures,
            "down_events": self.down_events,
            "live": self.live,
            "running": self.running,
            "commands": self.commands,
            "command_p50_s": _q(lat, 0.5),
            "command_p95_s": _q(lat, 0.95),
            "slowdown_p95": _q(slow, 0.95),
            "latencies": [round(x, 5) for x in lat],
            "slowdowns": [round(x, 4) for x in slow],
        }


def _q(values: list[float], q: float) -> float | None:
    return round(quantile(values, q), 5) if values else None


def merge(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Several providers' records of one host (one per rollout worker) as one."""
    out: dict[str, Any] = {}
    for key in ("placements", "failures", "down_events", "live", "running", "commands"):
        out[key] = sum(int(r.get(key, 0)) for r in records)
    lat = [x for r in records for x in r.get("latencies", [])]
    slow = [x for r in records for x in r.get("slowdowns", [])]
    out["command_p50_s"], out["command_p95_s"], out["slowdown_p95"] = _q(lat, 0.5), _q(lat, 0.95), _q(slow, 0.95)
    for key in ("url", "capacity", "healthy", "last_error"):
        values = [r[key] for r in records if key in r]
        if values:
            out[key] = all(values) if key == "healthy" else values[0]
    return out
