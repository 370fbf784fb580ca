"""``sandrl bench service``: the sandbox service beside the in-process provider, in one run.

The client is ``RemoteProvider`` as it comes: its calls on the service's call channel (one
upgraded connection), or with ``channel=False`` (``--transport http``) an HTTP request each. The
result's keys say ``http`` for the service's side either way; ``transport`` says which.

(a) exec round trip of ``true`` with one client, in process and over HTTP (in alternating blocks); (b) at each
concurrency N, N clients each doing create -> ``execs`` execs -> close at once, over HTTP
and in process: throughput (cycles/s), create/exec/close latency, errors, and the CPU each side
spent per cycle (the clients' process and the server's), which says which side limits. The server runs
as its own process (as in production, and so it does not share this process's GIL), on a
free port of 127.0.0.1 with a fresh state directory and token.

A level is ``rounds`` bursts of each mode, in the order HTTP, in process, in process, HTTP, ...
(so a host that speeds up or slows down during the level favours neither), each burst at least
``min_cycles`` cycles (a client runs several when N is small: 16 cycles of ~10 ms are no measure
of a rate). The level's ratio is of the two modes' cycles over their summed walls; the ratio of
each round is in the result too, so its spread shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from sandrl.bench.hostinfo import process_cpu_s
from sandrl.errors import SandboxUnavailableError, SandrlError
from sandrl.processes import stop_process
from sandrl.sandbox.base import Sandbox, SandboxProvider, SandboxSpec
from sandrl.sandbox.remote.config import ClientConfig
from sandrl.sandbox.remote.provider import RemoteProvider
from sandrl.stats import summary_ms
from sandrl.wiring.runner import local_provider

LEVELS = (1, 16, 64, 256)
ROUNDS = 2
MIN_CYCLES = 64
TARGETS = {"http_exec_over_inproc_p50_ms": 1.0, "p99_over_p50_exec_at_max": 10.0, "http_over_inproc_cycles": 0.8}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def server_process(state_dir: Path, max_live: int) -> AsyncIterator[tuple[str, str, int]]:
    """A sandbox server as a child process; yields its URL, token and pid."""
    port, token = _free_port(), secrets.token_hex(24)
    code = (
        "from sandrl.sandbox.service.server import serve; "
        f"serve('127.0.0.1', {port}, state_dir={str(state_dir)!r}, max_live={max_live}, log_level='warning')"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "SANDRL_TOKEN": token})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        async with httpx.AsyncClient() as client:
            while True:
                with contextlib.suppress(httpx.TransportError):
                    if (await client.get(url + "/healthz", timeout=1)).status_code == 200:
                        break
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SandboxUnavailableError(f"the benchmark's sandbox server did not start (exit {proc.poll()})")
                await asyncio.sleep(0.05)
        yield url, token, proc.pid
    finally:
        stop_process(proc, grace_s=60)


RT_BLOCKS = 6


async def _exec_round_trips(remote: SandboxProvider, local: SandboxProvider, n: int) -> tuple[list[float], list[float]]:
    """``n`` round trips of ``exec true`` with one client on each provider (remote, local), in blocks
    that alternate which goes first, so a host that drifts faster or slower favours neither."""
    sandboxes = [await remote.create(SandboxSpec(ttl_s=600)), await local.create(SandboxSpec(ttl_s=600))]
    samples: list[list[float]] = [[], []]
    try:
        for sandbox in sandboxes:
            for _ in range(20):
                await sandbox.exec("true")
        for block in range(RT_BLOCKS):
            size = n // RT_BLOCKS + (1 if block < n % RT_BLOCKS else 0)
            for side in (0, 1) if block % 2 == 0 else (1, 0):
                for _ in range(size):
                    t = time.perf_counter()
                    await sandboxes[side].exec("true")
                    samples[side].append(time.perf_counter() - t)
        return samples[0], samples[1]
    finally:
        for sandbox in sandboxes:
            await sandbox.close()


def _cpu_seconds(server_pid: int | None) -> tuple[float, float]:
    """CPU time (user + system) so far of this process and of the server process."""
    mine = time.process_time()
    if server_pid is None:
        return mine, 0.0
    try:
        return mine, process_cpu_s(server_pid)
    except (OSError, IndexError, ValueError):
        return mine, 0.0


async def _cycles(
    provider: SandboxProvider, clients: int, execs: int, server_pid: int | None = None, *, per_client: int = 1
) -> dict[str, Any]:
    """One burst: ``clients`` at once, each running ``per_client`` cycles one after another."""
    creates: list[float] = []
    runs: list[float] = []
    closes: list[float] = []
    errors: dict[str, int] = {}

    async def client() -> None:
        for _ in range(per_client):
            await cycle()

    async def cycle() -> None:
        sandbox: Sandbox | None = None
        try:
            t = time.perf_counter()
            sandbox = await provider.create(SandboxSpec(ttl_s=600))
            creates.append(time.perf_counter() - t)
            for _ in range(execs):
                t = time.perf_counter()
                result = await sandbox.exec("true")
                runs.append(time.perf_counter() - t)
                if result.exit_code != 0:
                    errors["exit_code"] = errors.get("exit_code", 0) + 1
            t = time.perf_counter()
            await sandbox.close()
            closes.append(time.perf_counter() - t)
            sandbox = None
        except SandrlError as exc:
            errors[exc.error_code] = errors.get(exc.error_code, 0) + 1
        finally:
            if sandbox is not None:
                with contextlib.suppress(SandrlError):
                    await sandbox.close()

    started = time.perf_counter()
    cpu = _cpu_seconds(server_pid)
    await asyncio.gather(*(client() for _ in range(clients)))
    wall = time.perf_counter() - started
    after = _cpu_seconds(server_pid)
    cycles = clients * per_client
    used = [round((a - b) * 1000 / cycles, 2) for b, a in zip(cpu, after, strict=True)]
    return {
        "clients": clients,
        "cycles": cycles,
        "cycles_per_s": round(cycles / wall, 2),
        # Which side limits: CPU per cycle of this process (the clients, or the in-process provider)
        # and of the server process (none in process); the sandboxes' own processes are not counted.
        "cpu_ms_per_cycle": {"this_process": used[0], "server": used[1] if server_pid else None},
        "wall_s": round(wall, 3),
        "errors_by_code": errors,
        "samples_s": {"create": creates, "exec": runs, "close": closes},  # summarised by _pooled
    }


def _pooled(bursts: list[dict[str, Any]]) -> dict[str, Any]:
    """One mode's bursts of a level as one measure: cycles over the summed walls, CPU per cycle
    over all cycles, latencies over every sample, errors summed."""
    cycles: int = sum(b["cycles"] for b in bursts)
    wall: float = sum(b["wall_s"] for b in bursts)

    def cpu(side: str) -> float | None:
        if bursts[0]["cpu_ms_per_cycle"][side] is None:
            return None
        spent: float = sum(b["cpu_ms_per_cycle"][side] * b["cycles"] for b in bursts)
        return round(spent / cycles, 2)

    errors: dict[str, int] = {}
    for b in bursts:
        for code, n in b["errors_by_code"].items():
            errors[code] = errors.get(code, 0) + n
    return {
        "clients": bursts[0]["clients"],
        "cycles": cycles,
        "bursts": len(bursts),
        "cycles_per_s": round(cycles / wall, 2),
        "cpu_ms_per_cycle": {"this_process": cpu("this_process"), "server": cpu("server")},
        "wall_s": round(wall, 3),
        **{what: summary_ms([x for b in bursts for x in b["samples_s"][what]]) for what in ("create", "exec", "close")},
        "errors": sum(errors.values()),
        "errors_by_code": errors,
    }


async def _level(
    remote: SandboxProvider, local: SandboxProvider, n: int, execs: int, server_pid: int, rounds: int, min_cycles: int
) -> dict[str, Any]:
    """Both modes at ``n`` clients: ``rounds`` bursts of each, HTTP and in process alternating first."""
    per_client = max(1, math.ceil(min_cycles / n))
    http: list[dict[str, Any]] = []
    inproc: list[dict[str, Any]] = []
    for k in range(rounds):
        order = ("http", "inproc") if k % 2 == 0 else ("inproc", "http")
        for via in order:
            if via == "http":
                http.append(await _cycles(remote, n, execs, server_pid, per_client=per_client))
            else:
                inproc.append(await _cycles(local, n, execs, per_client=per_client))
    pooled_http, pooled_inproc = _pooled(http), _pooled(inproc)
    return {
        "level": n,
        "cycles_per_client": per_client,
        "http": pooled_http,
        "inproc": pooled_inproc,
        "http_over_inproc": round(pooled_http["cycles_per_s"] / pooled_inproc["cycles_per_s"], 3),
        "http_over_inproc_by_round": [
            round(h["cycles_per_s"] / i["cycles_per_s"], 3) for h, i in zip(http, inproc, strict=True)
        ],
    }


async def run(
    concurrency: Sequence[int] = LEVELS,
    n_exec: int = 300,
    execs: int = 5,
    console: Console | None = None,
    *,
    rounds: int = ROUNDS,
    min_cycles: int = MIN_CYCLES,
    channel: bool = True,
) -> dict[str, Any]:
    """The benchmark; returns the JSON line's dict."""
    console = console or Console(stderr=True)
    levels = sorted(set(concurrency))
    if not levels or levels[0] < 1 or n_exec < 1 or execs < 1 or rounds < 1 or min_cycles < 1:
        raise SandrlError("concurrency levels, n_exec, execs, rounds and min_cycles must be at least 1")
    with tempfile.TemporaryDirectory(prefix="sandrl-bench-service-") as tmp:
        local = local_provider(Path(tmp) / "inproc")
        async with server_process(Path(tmp) / "server", max_live=levels[-1] + 8) as (url, token, pid):
            config = ClientConfig(max_connections=max(64, 2 * levels[-1]), timeout_s=300, retries=0, channel=channel)
            async with RemoteProvider(url, token=token, config=config) as remote:
                console.print(f"exec round trip of `true`, 1 client, {n_exec} times")
                remote_rts, local_rts = await _exec_round_trips(remote, local, n_exec)
                inproc_rt, http_rt = summary_ms(local_rts), summary_ms(remote_rts)
                rows: list[dict[str, Any]] = []
                for n in levels:
                    console.print(
                        f"{n} concurrent clients: create -> {execs} execs -> close, {rounds} bursts of each mode"
                    )
                    rows.append(await _level(remote, local, n, execs, pid, rounds, min_cycles))
        await local.close_all()
    top = rows[-1]["http"]
    over = round(http_rt["p50_ms"] - inproc_rt["p50_ms"], 3)
    tail = round(top["exec"]["p99_ms"] / top["exec"]["p50_ms"], 2) if top["exec"]["p50_ms"] else None
    result: dict[str, Any] = {
        "bench": "service",
        "cpus": os.cpu_count(),
        # How RemoteProvider's calls travel ("http" in the keys below is the service's port either way).
        "transport": "channel" if channel else "http",
        "exec_round_trip": {"inproc": inproc_rt, "http": http_rt, "http_over_inproc_p50_ms": over},
        "levels": rows,
        "rounds": rounds,
        "min_cycles": min_cycles,
        "targets": TARGETS,
        "met": {
            "http_exec_over_inproc_p50_ms": over <= TARGETS["http_exec_over_inproc_p50_ms"],
            "zero_errors_at_max": top["errors"] == 0,
            "p99_over_p50_exec_at_max": tail is not None and tail <= TARGETS["p99_over_p50_exec_at_max"],
            "http_over_inproc_cycles": all(
                row["http_over_inproc"] >= TARGETS["http_over_inproc_cycles"] for row in rows if row["level"] >= 16
            ),
        },
    }
    console.print(render_card(result))
    return result


def render_card(result: dict[str, Any]) -> Table:
    rt = result["exec_round_trip"]
    table = Table(title=f"sandbox service vs in-process ({result['cpus']} CPUs)")
    for col in ("clients", "via", "cycles/s", "create p50/p99 ms", "exec p50/p99 ms", "close p50 ms", "errors"):
        table.add_column(col, justify="right")
    table.add_row("1", "inproc exec rt", "", "", f"{rt['inproc']['p50_ms']:.2f}/{rt['inproc']['p99_ms']:.2f}", "", "")
    table.add_row("1", "http exec rt", "", "", f"{rt['http']['p50_ms']:.2f}/{rt['http']['p99_ms']:.2f}", "", "")
    ratios = []
    for row in result["levels"]:
        for via in ("http", "inproc"):
            r = row[via]
            table.add_row(
                str(row["level"]),
                via,
                f"{r['cycles_per_s']:.1f}",
                f"{r['create']['p50_ms']:.1f}/{r['create']['p99_ms']:.1f}",
                f"{r['exec']['p50_ms']:.2f}/{r['exec']['p99_ms']:.2f}",
                f"{r['close']['p50_ms']:.1f}",
                str(r["errors"]),
            )
        by_round = ", ".join(f"{x:.2f}" for x in row["http_over_inproc_by_round"])
        ratios.append(f"{row['level']}: {row['http_over_inproc']:.2f}x ({by_round})")
    table.caption = "HTTP cycles/s over in process (by round): " + "; ".join(ratios)
    return table
