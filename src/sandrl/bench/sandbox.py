"""``sandrl bench sandbox``: sandbox start-up, exec latency and idle footprint, side by side.

In one run, on the same host, so the ratios are fair: (a) a plain subprocess ``/bin/true``,
(b) bare ``bwrap ... true``, (c) sandrl cold create -> first exec returns (and where its time
goes: :mod:`sandrl.bench.cold_split`, the helper's own part beside (b)), (d) the same from
the warm pool, (e) exec round trip of ``true`` in a live sandbox, (f) memory per idle live
sandbox with N live at once, and whether all N closed cleanly. (c), (d) and (f) again for
``network=True`` sandboxes (their own namespace, slirp4netns and the egress filter,
:mod:`sandrl.sandbox.bwrap.nat`): what the NAT costs, beside ``network=False`` in the same run.
"""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table

from sandrl.bench import snapshots
from sandrl.bench.cold_split import cold_split
from sandrl.errors import SandboxUnavailableError
from sandrl.host_memory import meminfo_kb
from sandrl.progress import Progress
from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider, BwrapSandbox
from sandrl.sandbox.bwrap.inventory import traces
from sandrl.sandbox.bwrap.warm_pool import PooledProvider
from sandrl.sandbox.command import Command
from sandrl.stats import summary_ms
from sandrl.wiring.runner import local_provider

TARGETS = {
    "warm_p50_ms": 10.0,
    "warm_p99_ms": 50.0,
    "cold_over_bwrap_p50": 3.0,
    "exec_p50_ms": 5.0,
    "idle_host_mib_per_sandbox": 2.0,
}
"""The bars this benchmark's ``pass`` holds a host to (what tests and earlier issues asked)."""
LIMIT_TARGETS = {"cold_over_bwrap_p50": 1.0, "warm_p50_ms": 2.0, "fork16_p50_ms": 20.0}
"""A host at its limit (issue #45): reported apart (``limit``), not part of ``pass``."""


def _time_subprocess(argv: list[str], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run(argv, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        out.append(time.perf_counter() - t)
    return out


BARE_BWRAP = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-all", "--die-with-parent", "true"]


def _rss_pss_kb(pids: set[int]) -> tuple[int, int]:
    rss = pss = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Rss:"):
                        rss += int(line.split()[1])
                    elif line.startswith("Pss:"):
                        pss += int(line.split()[1])
        except OSError:
            continue
    return rss, pss


async def _cold(provider: BwrapProvider, spec: SandboxSpec, n: int, tick: Callable[[], None]) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        sandbox = await provider.create(spec)
        await sandbox.exec("true")
        out.append(time.perf_counter() - t)
        await sandbox.close()
        tick()
    return out


async def _warm(
    provider: BwrapProvider,
    spec: SandboxSpec,
    n: int,
    pool_size: int,
    tick: Callable[[], None],
    *,
    refilled: bool = False,
) -> list[float]:
    """``refilled``: each take finds the pool full (the refill waited for), not after a fixed pause."""
    pooled = PooledProvider(provider, pools=[(spec, pool_size)])
    pool = pooled.pool(spec)
    assert pool is not None
    await pool.wait_full()
    out = []
    try:
        for _ in range(n):
            t = time.perf_counter()
            sandbox = await pooled.create(spec)
            await sandbox.exec("true")
            out.append(time.perf_counter() - t)
            await sandbox.close()
            if refilled:
                await pool.wait_full()
            else:
                # Episodes arrive at a finite rate; give the refill the time one create takes.
                await asyncio.sleep(0.01)
            tick()
    finally:
        await pooled.close()
    return out


async def _exec_forms(provider: BwrapProvider, spec: SandboxSpec, n: int, tick: Callable[[], None]) -> dict[str, Any]:
    """``true`` as a shell line (the shell's builtin: one program runs), ``/bin/true`` as one (the shell, then
    the program) and ``true`` as an argv (the program, no shell), taking turns in one sandbox: each form's
    round trips, and its CPU per exec, the sandbox's (its cgroup: the helper's fork, the command) and this
    process's."""
    forms: dict[str, Command] = {"shell": "true", "shell_program": "/bin/true", "argv": ["true"]}
    times: dict[str, list[float]] = {k: [] for k in forms}
    cpu = {k: {"sandbox": 0.0, "provider": 0.0} for k in forms}
    async with await provider.create(spec) as sandbox:
        for command in forms.values():
            for _ in range(10):
                await sandbox.exec(command)
        for i in range(n):
            for form, command in list(forms.items())[i % 3 :] + list(forms.items())[: i % 3]:
                inside, own, t = sandbox.stats().cpu_s, time.process_time(), time.perf_counter()
                await sandbox.exec(command)
                times[form].append(time.perf_counter() - t)
                cpu[form]["provider"] += time.process_time() - own
                cpu[form]["sandbox"] += sandbox.stats().cpu_s - inside
            tick()
    return {
        "rows": {
            "exec_true": summary_ms(times["shell"]),
            "exec_bin_true": summary_ms(times["shell_program"]),
            "exec_true_argv": summary_ms(times["argv"]),
        },
        "cpu_ms_per_exec": {
            form: {where: round(1e3 * total / n, 4) for where, total in c.items()} for form, c in cpu.items()
        },
    }


async def _footprint(provider: BwrapProvider, spec: SandboxSpec, live: int, tick: Callable[[], None]) -> dict[str, Any]:
    gc.collect()
    await asyncio.sleep(0.2)
    avail_before = meminfo_kb("MemAvailable") or 0
    sandboxes: list[BwrapSandbox] = []
    sem = asyncio.Semaphore(4)

    async def one() -> None:
        async with sem:
            sandbox = await provider.create(spec)
            sandboxes.append(sandbox)
            tick()

    t = time.perf_counter()
    results = await asyncio.gather(*(one() for _ in range(live)), return_exceptions=True)
    create_s = time.perf_counter() - t
    errors = [r for r in results if isinstance(r, BaseException)]
    await asyncio.sleep(1.0)  # let lazy kernel work settle before measuring
    avail_after = meminfo_kb("MemAvailable") or 0
    stats = [s.stats() for s in sandboxes]
    cgroup_bytes = sum(st.memory_bytes for st in stats)
    kernel_bytes = sum(st.kernel_memory_bytes for st in stats)
    pids: set[int] = set()
    for s in sandboxes:
        pids |= s._group.processes()
    rss_kb, pss_kb = _rss_pss_kb(pids)
    ok = sum([(await s.exec("echo ok")).stdout == "ok\n" for s in sandboxes[:: max(1, len(sandboxes) // 20)]])
    t = time.perf_counter()
    await asyncio.gather(*(s.close() for s in sandboxes))
    close_s = time.perf_counter() - t
    n = max(1, len(sandboxes))
    # Only this run's sandboxes: another run sharing the host or the state directory has its own.
    left = traces(provider.state, provider.cgroups, [(s.id, s.uid) for s in sandboxes])
    leftovers = {"records": len(left.records), "cgroups": len(left.cgroups), "processes": len(left.processes)}
    return {
        "live": len(sandboxes),
        "create_errors": len(errors),
        "create_all_s": round(create_s, 3),
        "close_all_s": round(close_s, 3),
        "host_mib_per_sandbox": round((avail_before - avail_after) / 1024 / n, 3),
        "cgroup_mib_per_sandbox": round(cgroup_bytes / 2**20 / n, 3),
        "kernel_mib_per_sandbox": round(kernel_bytes / 2**20 / n, 3),
        "rss_mib_per_sandbox": round(rss_kb / 1024 / n, 3),
        "pss_mib_per_sandbox": round(pss_kb / 1024 / n, 3),
        "processes_per_sandbox": round(len(pids) / n, 2),
        "sampled_execs_ok": ok,
        "leftovers_after_close": leftovers,
        "closed_cleanly": not any(leftovers.values()),
    }


NET_LIVE = 100
"""At most this many idle sandboxes with the network for (f): one slirp4netns each."""


async def run(n: int = 200, live: int = 500, pool_size: int = 8, console: Console | None = None) -> dict[str, Any]:
    console = console or Console(stderr=True)
    provider = local_provider()
    spec = SandboxSpec()
    net_spec = SandboxSpec(network=True)
    # Warm up: the helper build, the host image's layers, the page cache.
    for _ in range(3):
        async with await provider.create(spec) as sb:
            await sb.exec("true")
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("subprocess /bin/true", total=n)
        plain = [*_time_subprocess(["/bin/true"], n)]
        progress.update(task, completed=n, description="bare bwrap true")
        if provider.bwrap is None:
            raise SandboxUnavailableError("the baseline (b) is a bare `bwrap true`: install bubblewrap")
        bare = _time_subprocess([provider.bwrap, *BARE_BWRAP], n)
        progress.update(task, completed=0, description="cold create -> first exec")
        cold = await _cold(provider, spec, n, lambda: progress.advance(task))
        split_n = max(10, n // 2)
        progress.update(task, completed=0, total=split_n, description="cold create, split by its steps")
        split = await cold_split(provider, spec, split_n, lambda: progress.advance(task))
        progress.update(task, total=n)
        progress.update(task, completed=0, description="warm pool create -> first exec")
        warm = await _warm(provider, spec, n, pool_size, lambda: progress.advance(task))
        progress.update(task, completed=0, description="exec round trip, shell line and argv")
        exec_forms = await _exec_forms(provider, spec, n, lambda: progress.advance(task))
        progress.update(task, completed=0, total=max(4, n // 10), description="snapshot, fork, pause/resume")
        live_ops = await snapshots.run(provider, spec, max(4, n // 10), lambda: progress.advance(task))
        progress.update(task, completed=0, description="cold create -> first exec, network=True")
        cold_net = await _cold(provider, net_spec, n, lambda: progress.advance(task))
        progress.update(task, completed=0, description="warm pool create -> first exec, network=True")
        warm_net = await _warm(provider, net_spec, n, pool_size, lambda: progress.advance(task))
        progress.update(task, completed=0, total=live, description=f"{live} idle sandboxes")
        footprint = await _footprint(provider, spec, live, lambda: progress.advance(task))
        net_live = min(live, NET_LIVE)
        progress.update(task, completed=0, total=net_live, description=f"{net_live} idle sandboxes, network=True")
        footprint_net = await _footprint(provider, net_spec, net_live, lambda: progress.advance(task))
    rows = {
        "subprocess_true": summary_ms(plain),
        "bwrap_true": summary_ms(bare),
        "cold_create_exec": summary_ms(cold),
        "warm_create_exec": summary_ms(warm),
        **exec_forms["rows"],
        **live_ops,
        "cold_create_exec_net": summary_ms(cold_net),
        "warm_create_exec_net": summary_ms(warm_net),
    }
    ratios = {
        "cold_over_bwrap_p50": round(rows["cold_create_exec"]["p50_ms"] / rows["bwrap_true"]["p50_ms"], 3),
        "warm_over_bwrap_p50": round(rows["warm_create_exec"]["p50_ms"] / rows["bwrap_true"]["p50_ms"], 3),
        "cold_net_over_cold_p50": round(rows["cold_create_exec_net"]["p50_ms"] / rows["cold_create_exec"]["p50_ms"], 3),
    }
    helper_ms = split["helper_ms"]
    split["helper_over_bwrap_p50"] = (
        round(helper_ms / rows["bwrap_true"]["p50_ms"], 3) if isinstance(helper_ms, float) else None
    )
    nat_cost = {
        "cold_p50_ms": round(rows["cold_create_exec_net"]["p50_ms"] - rows["cold_create_exec"]["p50_ms"], 3),
        "warm_p50_ms": round(rows["warm_create_exec_net"]["p50_ms"] - rows["warm_create_exec"]["p50_ms"], 3),
        "host_mib_per_sandbox": round(footprint_net["host_mib_per_sandbox"] - footprint["host_mib_per_sandbox"], 3),
        "processes_per_sandbox": round(footprint_net["processes_per_sandbox"] - footprint["processes_per_sandbox"], 2),
    }
    checks = {
        "warm_p50": rows["warm_create_exec"]["p50_ms"] <= TARGETS["warm_p50_ms"],
        "warm_p99": rows["warm_create_exec"]["p99_ms"] <= TARGETS["warm_p99_ms"],
        "cold_ratio": ratios["cold_over_bwrap_p50"] <= TARGETS["cold_over_bwrap_p50"],
        "exec_p50": rows["exec_true"]["p50_ms"] <= TARGETS["exec_p50_ms"],
        "snapshot_p50": rows["snapshot_10mib"]["p50_ms"] <= snapshots.TARGETS["snapshot_10mib_p50_ms"],
        "fork16": rows["fork_16_until_exec"]["p50_ms"]
        <= snapshots.TARGETS["fork16_over_warm_create"] * rows["warm_create_exec"]["p50_ms"],
        "pause_resume_p50": rows["pause_resume"]["p50_ms"] <= snapshots.TARGETS["pause_resume_p50_ms"],
        "idle_memory": footprint["host_mib_per_sandbox"] <= TARGETS["idle_host_mib_per_sandbox"]
        and footprint["live"] == live
        and footprint["closed_cleanly"],
        "net_sandboxes": footprint_net["live"] == min(live, NET_LIVE)
        and footprint_net["create_errors"] == 0
        and footprint_net["closed_cleanly"],
    }
    table = Table(title=f"sandrl bench sandbox ({os.cpu_count()} cores, n={n})")
    for col in ("measure", "p50 ms", "p95 ms", "p99 ms"):
        table.add_column(col, justify="right" if col != "measure" else "left")
    labels = {
        "subprocess_true": "(a) subprocess /bin/true",
        "bwrap_true": "(b) bare bwrap true",
        "cold_create_exec": "(c) cold create -> first exec",
        "warm_create_exec": "(d) warm pool create -> first exec",
        "exec_true": "(e) exec `true` in a live sandbox",
        "exec_bin_true": "(e') exec `/bin/true`: the shell, then the program",
        "exec_true_argv": "(e'') exec ['true'], an argv: the program, no shell",
        "snapshot_10mib": "(g) snapshot, 10 MiB written",
        "fork_1_until_exec": "(h) fork 1, until it ran true",
        "fork_16_until_exec": "(i) fork 16, until all ran true",
        "fork_16_first_until_exec": "(i') the first fork 16 (nothing made ahead)",
        "pause_resume": "(j) pause + resume",
        "cold_create_exec_net": "(c) cold create -> first exec, network=True",
        "warm_create_exec_net": "(d) warm pool create -> first exec, network=True",
    }
    for key, label in labels.items():
        r = rows[key]
        table.add_row(label, f"{r['p50_ms']:.2f}", f"{r['p95_ms']:.2f}", f"{r['p99_ms']:.2f}")
    console.print(table)
    fp = footprint
    console.print(
        f"(f) {fp['live']} idle live: host {fp['host_mib_per_sandbox']:.2f} MiB each, "
        f"cgroup {fp['cgroup_mib_per_sandbox']:.2f} MiB (kernel {fp['kernel_mib_per_sandbox']:.2f}), "
        f"RSS {fp['rss_mib_per_sandbox']:.2f} MiB, PSS {fp['pss_mib_per_sandbox']:.2f} MiB; "
        f"closed cleanly: {fp['closed_cleanly']}"
    )
    fn = footprint_net
    console.print(
        f"(f) {fn['live']} idle live with the network: host {fn['host_mib_per_sandbox']:.2f} MiB each, "
        f"{fn['processes_per_sandbox']:.1f} processes each; closed cleanly: {fn['closed_cleanly']}"
    )
    console.print(
        "(e) CPU per exec, in the sandbox + here: "
        + "; ".join(
            f"{form} {c['sandbox']:.3f} + {c['provider']:.3f} ms" for form, c in exec_forms["cpu_ms_per_exec"].items()
        )
    )
    console.print(f"ratios: cold/bwrap {ratios['cold_over_bwrap_p50']}x, warm/bwrap {ratios['warm_over_bwrap_p50']}x")
    if split["n"]:
        console.print(
            f"(c) split, p50 of {split['n']}: provider {split['provider_ms']} ms, helper {split['helper_ms']} ms "
            f"({split['helper_over_bwrap_p50']}x bare bwrap true; joins {split['cgroup_joins_ms']}, namespaces and "
            f"pid 1 {split['namespaces_and_pid1_ms']}, root and /dev {split['root_and_dev_ms']}, handover "
            f"{split['handover_ms']}), agent's hello {split['agent_hello_ms']} ms, "
            f"first exec {split['first_exec_ms']} ms"
        )
    limit = {
        "cold_over_bwrap_p50": ratios["cold_over_bwrap_p50"] <= LIMIT_TARGETS["cold_over_bwrap_p50"],
        "warm_p50_ms": rows["warm_create_exec"]["p50_ms"] <= LIMIT_TARGETS["warm_p50_ms"],
        "fork16_p50_ms": rows["fork_16_until_exec"]["p50_ms"] <= LIMIT_TARGETS["fork16_p50_ms"],
    }
    console.print(
        "at the host's limit (#45, targets cold <= 1.0x bwrap, warm <= 2 ms, fork 16 <= 20 ms): "
        + ", ".join(f"{k} {'met' if v else 'not met'}" for k, v in limit.items())
    )
    console.print(
        f"NAT costs: +{nat_cost['cold_p50_ms']:.2f} ms cold, +{nat_cost['warm_p50_ms']:.2f} ms warm, "
        f"+{nat_cost['host_mib_per_sandbox']:.2f} MiB host memory per idle sandbox"
    )
    return {
        "bench": "sandbox",
        **rows,
        "ratios": ratios,
        "cold_create_split": split,
        "exec_cpu_ms": exec_forms["cpu_ms_per_exec"],
        "idle": footprint,
        "idle_net": footprint_net,
        "nat_cost": nat_cost,
        "targets": {**TARGETS, **snapshots.TARGETS},
        "checks": checks,
        "pass": all(checks.values()),
        "limit": {"targets": LIMIT_TARGETS, "met": limit},
    }
