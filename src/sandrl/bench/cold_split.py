"""Where a cold create's time goes: the split row of ``sandrl bench sandbox``.

A bare ``bwrap true`` (row (b)) makes namespaces, mounts and a pivot and execs ``true``; a cold
create (row (c)) does that too, and also what bubblewrap does not: the provider's bookkeeping (a uid
slot, the record, the cgroups and their limits, the helper's spawn), the agent's start and hello, and
a first command asked over the agent's socket. This row times each part of ``n`` cold creates from
the helper's own timestamps (``--times``: ``CLOCK_MONOTONIC``, the clock of :func:`time.monotonic`,
written on the sandbox's log, which the row reads before each close), so the launch itself can be
held against bubblewrap's and the rest seen for what it is:

- ``provider``: from ``create()`` until the helper runs (image lookup, slot, record, cgroups, spawn);
- ``helper``: from the helper's start until pid 1 execs the agent, of which ``cgroup_joins``,
  ``namespaces_and_pid1``, ``root_and_dev`` and ``handover`` (the root sent, pid 1's pivot);
- ``agent_hello``: the agent's start and hello, until ``create()`` returns;
- ``first_exec``: the first ``exec("true")``.

Its own loop, after row (c): the timestamps cost a few writes to the log per create.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider

__all__ = ["STEPS", "cold_split", "helper_times"]

STEPS = ("started", "joined", "pid1", "root", "sent", "agent")
"""The helper's timestamps, in the order a full launch writes them."""


def helper_times(log: str) -> dict[str, float]:
    """The ``sandrl-times STEP MICROSECONDS`` lines of a helper's log, in seconds of the monotonic clock."""
    times: dict[str, float] = {}
    for line in log.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "sandrl-times" and parts[1] in STEPS and parts[2].isdigit():
            times[parts[1]] = int(parts[2]) / 1e6
    return times


async def cold_split(provider: BwrapProvider, spec: SandboxSpec, n: int, tick: Callable[[], None]) -> dict[str, object]:
    """Medians (ms) of each part of ``n`` cold creates and their first ``exec("true")``; ``n`` says how
    many creates had every timestamp (a launch made ahead has none of the full launch's)."""
    parts: dict[str, list[float]] = {
        k: []
        for k in (
            "provider",
            "helper",
            "cgroup_joins",
            "namespaces_and_pid1",
            "root_and_dev",
            "handover",
            "agent_hello",
            "first_exec",
            "total",
        )
    }
    before = provider.launcher.times
    provider.launcher.times = True
    try:
        for _ in range(n):
            start = time.monotonic()
            sandbox = await provider.create(spec)
            created = time.monotonic()
            await sandbox.exec("true")
            done = time.monotonic()
            log = provider.state.record_dir(sandbox.id) / "log"
            t = helper_times(log.read_text(errors="replace"))
            await sandbox.close()
            tick()
            if not all(step in t for step in STEPS) or t["started"] < start:
                continue  # a launch made ahead (for a fork): not a cold create
            parts["provider"].append(t["started"] - start)
            parts["helper"].append(t["agent"] - t["started"])
            parts["cgroup_joins"].append(t["joined"] - t["started"])
            parts["namespaces_and_pid1"].append(t["pid1"] - t["joined"])
            parts["root_and_dev"].append(t["root"] - t["pid1"])
            parts["handover"].append(t["agent"] - t["root"])
            parts["agent_hello"].append(created - t["agent"])
            parts["first_exec"].append(done - created)
            parts["total"].append(done - start)
    finally:
        provider.launcher.times = before
    timed = len(parts["total"])
    split: dict[str, object] = {
        f"{k}_ms": round(statistics.median(v) * 1000, 3) if v else None for k, v in parts.items()
    }
    return {"n": timed, **split}
