"""``sandrl bench density``: how many idle sandboxes this host carries, and what each costs.

N idle sandboxes live at once (most ``network=False``; :data:`NET_SHARE` of them ``network=True``),
and with them, in one run on one host:

- **host memory each**: ``MemAvailable`` before the first create and with all N live, over N
  (everything the host gave up: the sandboxes' processes and their cgroups' kernel memory, the
  kernel objects no cgroup is charged for, and the provider's own growth); beside it the sum of the
  sandboxes' memory cgroups, the provider process's RSS growth and the growth of the kernel's
  unreclaimable slab (``SUnreclaim``: most of what no cgroup is charged for), each over N;
- **warm create -> first exec p50** at 0, 1,000 and N live, the same spec each time, from a warm
  pool that was full before each take (what a warm create is: its sandbox was ready);
- **the time to close all N**, and **what is left after** (nothing): records, cgroups and processes
  of those sandboxes (:func:`~sandrl.sandbox.bwrap.inventory.traces`), uid slots still locked by
  one of them, the provider's file descriptors, threads and asyncio tasks beyond what it had
  before, lines of the host's mount table, and network interfaces of the host's namespace;
- what the provider holds per live sandbox (fds, tasks, threads) and whether its mount table grew.

Targets: host memory <= 1 MiB each, warm create p50 at N live <= 1.5x at 0 live, all closed with
nothing left. The same pieces as ``sandrl bench sandbox``'s idle footprint and warm creates.
"""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table

from sandrl.bench.sandbox import _rss_pss_kb, _warm
from sandrl.host_memory import meminfo_kb
from sandrl.progress import Progress
from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider, BwrapSandbox
from sandrl.sandbox.bwrap.inventory import traces
from sandrl.stats import summary_ms
from sandrl.wiring.runner import local_provider

TARGETS = {"host_mib_per_sandbox": 1.0, "warm_at_n_over_0_p50": 1.5}
NET_SHARE = 0.05
"""The share of the N with ``network=True``: each has a slirp4netns of its own (a process, its
sockets, its egress filter), so it costs more than one without. Episodes that need the internet
(``allow_internet`` tasks, pip installs) are the exception in an RL fleet: most run tests offline."""
MID_LIVE = 1000
"""The middle level at which the warm create is measured."""
CREATE_CONCURRENCY = 4
"""Creates in flight while filling the host: as the service sees them from a few clients."""
POOL_SIZE = 4


def _own_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _own_rss_kb() -> int:
    with open("/proc/self/status") as f:
        return next((int(line.split()[1]) for line in f if line.startswith("VmRSS:")), 0)


def _mount_lines() -> int:
    with open("/proc/self/mountinfo") as f:
        return sum(1 for _ in f)


def _host_links() -> int:
    return len(os.listdir("/sys/class/net"))


def _tasks() -> int:
    return len(asyncio.all_tasks())


def _own_view() -> dict[str, int]:
    """What the provider process holds, and the host's namespace shows, that a sandbox could add to."""
    return {
        "fds": _own_fds(),
        "threads": threading.active_count(),
        "tasks": _tasks(),
        "mount_lines": _mount_lines(),
        "host_links": _host_links(),
    }


MEMORY_FLOOR_SHARE = 0.1
"""The fill stops while the host has less than this share of its memory available (other work shares it)."""
MIN_FILL_RATE = 5.0
"""Creates per second, over the last :data:`RATE_WINDOW`, under which the fill stops: the host has stalled
(on the 2-core VM at ~6,000 live, its kernel spent 84% of the CPU reclaiming memory, ``shrink_slab``)."""
RATE_WINDOW = 200


async def _fill(
    provider: BwrapProvider,
    live: list[BwrapSandbox],
    target: int,
    net_every: int,
    tick: Callable[[], None],
    stopped: list[str],
) -> list[BaseException]:
    """Create sandboxes until ``live`` holds ``target`` (every ``net_every``-th with the network), or the
    host is at its limit: then the reason is appended to ``stopped`` and the rest are not made."""
    sem = asyncio.Semaphore(CREATE_CONCURRENCY)
    errors: list[BaseException] = []
    plain, net = SandboxSpec(), SandboxSpec(network=True)
    floor_kb = int((meminfo_kb("MemTotal") or 0) * MEMORY_FLOOR_SHARE)
    made: list[float] = []

    def at_limit() -> str | None:
        available = meminfo_kb("MemAvailable")
        if available is not None and available < floor_kb:
            return f"the host had {available >> 10} MiB of memory available, under {MEMORY_FLOOR_SHARE:.0%} of it"
        if len(made) > RATE_WINDOW:
            rate = RATE_WINDOW / (made[-1] - made[-1 - RATE_WINDOW])
            if rate < MIN_FILL_RATE:
                return f"creates slowed to {rate:.1f}/s at {len(live)} live (under {MIN_FILL_RATE:g}/s)"
        return None

    async def one(i: int) -> None:
        async with sem:
            if stopped:
                return
            try:
                sandbox = await provider.create(net if net_every and i % net_every == net_every - 1 else plain)
            except Exception as exc:  # counted and reported: a host at its limit refuses some
                errors.append(exc)
                return
            live.append(sandbox)
            made.append(time.perf_counter())
            tick()
            if len(made) % 20 == 0 and not stopped and (why := at_limit()) is not None:
                stopped.append(why)

    await asyncio.gather(*(one(i) for i in range(len(live), target)))
    return errors


async def _warm_p50(provider: BwrapProvider, samples: int, tick: Callable[[], None]) -> dict[str, float]:
    return summary_ms(await _warm(provider, SandboxSpec(), samples, POOL_SIZE, tick, refilled=True))


def _slots_held(provider: BwrapProvider, closed: list[tuple[str, int]]) -> int:
    """Slots still locked by one of the closed sandboxes (a freed slot may be another's already)."""
    return sum(provider.state.slot_owner(index) == sid for sid, index in closed)


async def run(
    live: int = 10_000,
    samples: int = 50,
    net_share: float = NET_SHARE,
    console: Console | None = None,
    provider: BwrapProvider | None = None,
) -> dict[str, Any]:
    """Fill the host with ``live`` idle sandboxes and measure (see the module); everything made is
    closed before this returns, whatever fails."""
    console = console or Console(stderr=True)
    provider = provider or local_provider()
    net_every = round(1 / net_share) if net_share > 0 else 0
    sandboxes: list[BwrapSandbox] = []
    # Warm up (the helper build, the image's layers, the page cache), with creates in flight at once and
    # one with the network: the provider's thread pools and its egress filter's programs (4 fds) exist
    # before the baseline, and what the provider holds after the close is compared with it.
    await _fill(provider, sandboxes, 2 * CREATE_CONCURRENCY, 2, lambda: None, [])
    await asyncio.gather(*(s.close() for s in sandboxes), return_exceptions=True)
    sandboxes.clear()
    warm: dict[str, dict[str, float]] = {}
    errors: list[BaseException] = []
    stopped: list[str] = []
    gc.collect()
    await asyncio.sleep(0.5)
    before = _own_view()
    avail_before = meminfo_kb("MemAvailable") or 0
    slab_before = meminfo_kb("SUnreclaim") or 0
    rss_before = _own_rss_kb()
    held: dict[str, Any] = {}
    close_s = 0.0
    try:
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("warm create at 0 live", total=samples)
            warm["0"] = await _warm_p50(provider, samples, lambda: progress.advance(task))
            mid = min(MID_LIVE, live)
            progress.update(task, completed=0, total=mid, description=f"{mid} idle sandboxes")
            t = time.perf_counter()
            errors += await _fill(provider, sandboxes, mid, net_every, lambda: progress.advance(task), stopped)
            fill_s = time.perf_counter() - t
            if live > mid and not stopped:
                progress.update(task, completed=0, total=samples, description=f"warm create at {len(sandboxes)} live")
                warm[str(len(sandboxes))] = await _warm_p50(provider, samples, lambda: progress.advance(task))
                progress.update(task, completed=mid, total=live, description=f"{live} idle sandboxes")
                t = time.perf_counter()
                errors += await _fill(provider, sandboxes, live, net_every, lambda: progress.advance(task), stopped)
                fill_s += time.perf_counter() - t
            await asyncio.sleep(1.0)  # lazy kernel work settles before the measure
            avail_after = meminfo_kb("MemAvailable") or 0
            slab_growth_kb = (meminfo_kb("SUnreclaim") or 0) - slab_before
            rss_after = _own_rss_kb()
            at_n = _own_view()
            progress.update(task, completed=0, total=samples, description=f"warm create at {len(sandboxes)} live")
            warm["n"] = await _warm_p50(provider, samples, lambda: progress.advance(task))
            held = _footprint(provider, sandboxes, avail_before - avail_after, rss_after - rss_before, before, at_n)
            held["kernel_slab_mib_per_sandbox"] = round(slab_growth_kb / 1024 / max(1, len(sandboxes)), 3)
            step = max(1, len(sandboxes) // 20)
            held["sampled_execs_ok"] = sum([(await s.exec(["echo", "ok"])).stdout == "ok\n" for s in sandboxes[::step]])
            held["create_all_s"] = round(fill_s, 3)
    finally:
        closed = [(s.id, s.slot_index, s.uid) for s in sandboxes]
        t = time.perf_counter()
        await asyncio.gather(*(s.close() for s in sandboxes), return_exceptions=True)
        close_s = time.perf_counter() - t
        sandboxes.clear()
    gc.collect()
    await asyncio.sleep(0.5)
    after = _own_view()
    left = traces(provider.state, provider.cgroups, [(sid, uid) for sid, _, uid in closed])
    leftovers = {
        "records": len(left.records),
        "cgroups": len(left.cgroups),
        "processes": len(left.processes),
        "slots": _slots_held(provider, [(sid, index) for sid, index, _ in closed]),
        **{key: max(0, after[key] - before[key]) for key in before},
    }
    n = held.get("live", 0)
    ratio = round(warm["n"]["p50_ms"] / warm["0"]["p50_ms"], 3) if warm["0"]["p50_ms"] else float("inf")
    checks = {
        "all_live": n == live and not errors,
        "host_memory": n > 0 and held["host_mib_per_sandbox"] <= TARGETS["host_mib_per_sandbox"],
        "warm_at_n": ratio <= TARGETS["warm_at_n_over_0_p50"],
        "closed_cleanly": not any(leftovers.values()),
    }
    result: dict[str, Any] = {
        "bench": "density",
        "live": live,
        "net_share": net_share,
        "reached": held.get("live", 0),
        "stopped_by": stopped[0] if stopped else None,
        "create_errors": len(errors),
        "first_errors": sorted({f"{type(e).__name__}: {e}"[:300] for e in errors})[:3],
        "held": held,
        "warm_create_exec": warm,
        "warm_at_n_over_0_p50": ratio,
        "close_all_s": round(close_s, 3),
        "leftovers_after_close": leftovers,
        "targets": TARGETS,
        "checks": checks,
        "pass": all(checks.values()),
    }
    _card(console, result)
    return result


def _footprint(
    provider: BwrapProvider,
    sandboxes: list[BwrapSandbox],
    avail_drop_kb: int,
    rss_growth_kb: int,
    before: dict[str, int],
    at_n: dict[str, int],
) -> dict[str, Any]:
    """Memory each (host, cgroups, processes, the provider's growth) and what the provider holds per sandbox."""
    n = max(1, len(sandboxes))
    stats = [s.stats() for s in sandboxes]
    pids: set[int] = set()
    for s in sandboxes:
        pids |= s._group.processes()
    rss_kb, pss_kb = _rss_pss_kb(pids)
    net = [st for s, st in zip(sandboxes, stats, strict=True) if s.spec.network]
    return {
        "live": len(sandboxes),
        "live_with_network": len(net),
        "host_mib_per_sandbox": round(avail_drop_kb / 1024 / n, 3),
        "cgroup_mib_per_sandbox": round(sum(st.memory_bytes for st in stats) / 2**20 / n, 3),
        "cgroup_kernel_mib_per_sandbox": round(sum(st.kernel_memory_bytes for st in stats) / 2**20 / n, 3),
        "cgroup_mib_per_network_sandbox": round(sum(st.memory_bytes for st in net) / 2**20 / max(1, len(net)), 3),
        "pss_mib_per_sandbox": round(pss_kb / 1024 / n, 3),
        "rss_mib_per_sandbox": round(rss_kb / 1024 / n, 3),
        "provider_rss_kib_per_sandbox": round(rss_growth_kb / n, 2),
        "processes_per_sandbox": round(len(pids) / n, 2),
        "provider_per_sandbox": {
            key: round((at_n[key] - before[key]) / n, 3) for key in ("fds", "threads", "tasks", "mount_lines")
        },
        "host_links_added": at_n["host_links"] - before["host_links"],
        "mem_available_mib_with_all_live": (meminfo_kb("MemAvailable") or 0) >> 10,
    }


def _card(console: Console, r: dict[str, Any]) -> None:
    held, warm, left = r["held"], r["warm_create_exec"], r["leftovers_after_close"]
    table = Table(title=f"sandrl bench density ({os.cpu_count()} cores, {r['live']} live)")
    for col in ("measure", "value", "target"):
        table.add_column(col, justify="left" if col == "measure" else "right")
    if held:
        table.add_row(
            "live (with the network)", f"{held['live']} ({held['live_with_network']})", f"{r['live']}, no errors"
        )
        table.add_row("host memory each (MemAvailable)", f"{held['host_mib_per_sandbox']:.3f} MiB", "<= 1 MiB")
        table.add_row(
            "  cgroups each (kernel), PSS each",
            f"{held['cgroup_mib_per_sandbox']:.3f} ({held['cgroup_kernel_mib_per_sandbox']:.3f}), "
            f"{held['pss_mib_per_sandbox']:.3f} MiB",
            "",
        )
        table.add_row("  provider RSS each", f"{held['provider_rss_kib_per_sandbox']:.1f} KiB", "")
        table.add_row("  the kernel's unreclaimable slab each", f"{held['kernel_slab_mib_per_sandbox']:.3f} MiB", "")
        per = held["provider_per_sandbox"]
        table.add_row(
            "provider per sandbox: fds, tasks, threads",
            f"{per['fds']:.2f}, {per['tasks']:.2f}, {per['threads']:.3f}",
            "",
        )
        table.add_row("processes per sandbox", f"{held['processes_per_sandbox']:.2f}", "")
        table.add_row("create all", f"{held['create_all_s']:.1f} s", "")
    for level, summary in warm.items():
        label = f"{held.get('live', '?')}" if level == "n" else level
        table.add_row(f"warm create -> first exec p50, {label} live", f"{summary['p50_ms']:.2f} ms", "")
    table.add_row("  at N over at 0", f"{r['warm_at_n_over_0_p50']:.2f}x", "<= 1.5x")
    table.add_row("close all", f"{r['close_all_s']:.1f} s", "")
    what = ", ".join(f"{k} {v}" for k, v in left.items() if v) or "nothing"
    table.add_row("left after close", what, "nothing")
    console.print(table)
    if r["stopped_by"]:
        console.print(f"stopped at {r['reached']} live: {r['stopped_by']}")
    if r["first_errors"]:
        console.print(f"{r['create_errors']} creates failed, e.g.: " + "; ".join(r["first_errors"]))
    console.print("checks: " + ", ".join(f"{k} {'ok' if v else 'FAILED'}" for k, v in r["checks"].items()))


__all__ = ["NET_SHARE", "TARGETS", "run"]
