"""E2B's ``get_metrics`` over the sandbox service: a sandbox's CPU, memory and disk, from its cgroup.

``GET /sandboxes/{id}/metrics`` answers E2B's list of ``SandboxMetric`` with one entry, read when
asked (sandrl keeps no history of samples; a window ``start``..``end`` that ends before now
gets none):

- ``cpuCount``: the sandbox's CPU quota, rounded up to whole cores (at least 1);
- ``cpuUsedPct``: the CPU it used since the previous metrics read (or since it was created), as a
  percent of ``cpuCount`` cores over that time: 0 while paused;
- ``memTotal``: its memory limit; ``memUsed``: what its cgroup is charged, less reclaimable page
  cache, so it includes the writable layer, which lives in memory and counts against the limit;
  ``memCache``: that reclaimable page cache;
- ``diskTotal``: its writable layer's size (``disk_mb``); ``diskUsed``: the bytes written in it.
"""

from __future__ import annotations

import datetime
import time
from typing import Annotated, Any, Protocol, runtime_checkable

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse

from sandrl.sandbox.bwrap.cgroups import SandboxStats
from sandrl.sandbox.service.e2b.control import SandboxId, cpu_count, not_supported, registry_of
from sandrl.sandbox.service.routes import ERRORS
from sandrl.sandbox.service.state import Entry

router = APIRouter(tags=["e2b"])
CLOCK_SLACK_S = 5.0
"""A window that ends this little before now still gets the entry of now (the client's clock, whole seconds)."""


@runtime_checkable
class Metered(Protocol):
    """A sandbox that reports its usage (the bubblewrap backend's)."""

    def stats(self) -> SandboxStats: ...

    def disk_usage(self) -> tuple[int, int]: ...


def sample(entry: Entry, sandbox: Metered, since: tuple[float, float] | None) -> tuple[dict[str, Any], float, float]:
    """The metric entry of now, with (now, CPU seconds) for the next read's CPU share."""
    now = time.time()
    stats = sandbox.stats()
    then, cpu_then = since if since is not None else (entry.created_at, 0.0)
    cores = cpu_count(entry)
    wall = max(now - then, 1e-6)
    pct = min(100.0, max(0.0, 100.0 * (stats.cpu_s - cpu_then) / (wall * cores)))
    disk_used, disk_total = sandbox.disk_usage()
    cache = min(stats.memory_cache_bytes, stats.memory_bytes)
    metric = {
        "timestamp": datetime.datetime.fromtimestamp(now, datetime.UTC).isoformat().replace("+00:00", "Z"),
        "timestampUnix": int(now),
        "cpuCount": cores,
        "cpuUsedPct": round(pct, 2),
        "memUsed": stats.memory_bytes - cache,
        "memTotal": entry.spec.memory_mb << 20,
        "memCache": cache,
        "diskUsed": disk_used,
        "diskTotal": disk_total or entry.spec.disk_mb << 20,
    }
    return metric, now, stats.cpu_s


@router.get("/sandboxes/{sandbox_id}/metrics", responses={k: ERRORS[k] for k in (400, 401, 404)})
async def get_metrics(
    sandbox_id: SandboxId,
    request: Request,
    start: Annotated[int | None, Query(ge=0, description="Unix seconds: entries from then.")] = None,
    end: Annotated[int | None, Query(ge=0, description="Unix seconds: entries until then.")] = None,
) -> JSONResponse:
    """The sandbox's CPU, memory and disk now (``Sandbox.get_metrics``); see the module."""
    registry = registry_of(request)
    entry = registry.service.get(sandbox_id)
    sandbox = entry.sandbox
    if not isinstance(sandbox, Metered):
        raise not_supported("sandbox metrics", "this server's sandbox backend does not report them")
    record = registry.of(entry)
    metric, now, cpu = sample(entry, sandbox, record.cpu_sample)
    record.cpu_sample = (now, cpu)
    inside = (start is None or start <= now + 1) and (end is None or end >= now - CLOCK_SLACK_S)
    return JSONResponse([metric] if inside else [])
