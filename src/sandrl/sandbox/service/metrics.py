"""Prometheus metrics of the sandbox service (``GET /metrics``).

One registry per service, so several services (tests, one process) never share counters.
Host CPU and memory pressure are read at scrape time from the kernel's pressure stall
information (``/proc/pressure``: the share of the last 10 s some task waited for the
resource) and ``/proc/meminfo``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from sandrl.host_memory import mem_available_bytes, recent

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


def pressure_avg10(
    resource: str, kind: str = "some", root: Path = Path("/proc/pressure"), *, max_age_s: float = 0.0
) -> float | None:
    """The kernel's ``avg10`` stall percentage for ``resource`` (cpu, memory, io), or None without PSI;
    read at most ``max_age_s`` ago (0: now). A 10-second average moves little in 50 ms, so a burst
    of admission checks shares one reading (as they share ``MemAvailable``'s)."""
    return recent(("pressure", root, resource, kind), functools.partial(_read_avg10, root / resource, kind), max_age_s)


def _read_avg10(path: Path, kind: str) -> float | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == kind:
            for f in fields[1:]:
                if f.startswith("avg10="):
                    return float(f.removeprefix("avg10="))
    return None


class _HostCollector:
    """Host CPU and memory pressure, read when scraped."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        for resource in ("cpu", "memory"):
            value = pressure_avg10(resource)
            if value is not None:
                g = GaugeMetricFamily(
                    f"sandrl_host_{resource}_pressure_percent",
                    f"Share of the last 10 s some task on the host waited for {resource} (PSI some avg10).",
                )
                g.add_metric([], value)
                yield g
        available = mem_available_bytes()
        if available is not None:
            g = GaugeMetricFamily("sandrl_host_memory_available_bytes", "MemAvailable of the host.")
            g.add_metric([], float(available))
            yield g


class ServiceMetrics:
    def __init__(self, live: Callable[[], int]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.live = Gauge("sandrl_sandboxes_live", "Sandboxes alive on this server.", registry=r)
        self.live.set_function(lambda: float(live()))
        self.creates = Counter("sandrl_sandbox_creates", "Sandboxes created (rate() gives creates/s).", registry=r)
        self.closes = Counter("sandrl_sandbox_closes", "Sandboxes gone, by why.", ["reason"], registry=r)
        self.create_seconds = Histogram(
            "sandrl_sandbox_create_seconds", "Time to create a sandbox.", buckets=LATENCY_BUCKETS, registry=r
        )
        self.exec_seconds = Histogram(
            "sandrl_exec_seconds", "Time of an exec, request to result.", buckets=LATENCY_BUCKETS, registry=r
        )
        self.failures = Counter("sandrl_failures", "Error answers, by error_code.", ["error_code"], registry=r)
        self.channels = Gauge(
            "sandrl_call_channels", "Call channels open (a client's calls on one connection).", registry=r
        )
        self.reaped = Counter("sandrl_sandboxes_reaped", "Leftovers of a crashed predecessor removed.", registry=r)
        r.register(_HostCollector())

    def render(self) -> bytes:
        return generate_latest(self.registry)
