"""``sandrl bench cluster``: the same episodes on one host in-process and on a Ray cluster with two hosts.

Both sides run the same groups of :class:`~sandrl.rollout.agents.scripted.ReplayAgent` episodes on
generated ``echo`` tasks, every turn preceded by the same fixed emulated model time, all groups
submitted at once, the same number of episode slots in all:

- **in process**: one RolloutRunner over the local bubblewrap provider, called directly;
- **on Ray**: two ``sandrl serve sandboxes`` hosts on loopback (started here), two rollout-worker
  actors (each a RolloutRunner over a :class:`~sandrl.cluster.fleet.FleetProvider` of both hosts,
  half the slots each), each group sent to an actor and its result awaited by the driver.

The *orchestration overhead* of an episode is the time it spends on neither the model nor the
sandbox's own work, summed over three parts:

- ``dispatch``: Ray's part, a group's latency in the driver minus its time inside the worker's runner;
- ``transport``: per command, the agent's wall time in the exec call minus the command's run time
  as the sandbox measured it (HTTP and placement on Ray; the supervisor socket in process);
- ``runner``: the episode's total minus the phases it waits on (:attr:`Timings.overhead_s`).

The target: overhead on Ray <= 5% of the episode time. The end-to-end latencies are reported
side by side too; on one small machine that also runs both sandbox hosts they move with the
load of the commands (every sandbox shares its cores), so the target is judged on the parts.
Ends with one JSON line.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from sandrl.cluster.hosts import HostConfig
from sandrl.errors import ConfigError, SandrlError
from sandrl.processes import stop_process
from sandrl.rollout.agents.scripted import SOLUTION, ReplayAgent, ThinkTime
from sandrl.rollout.runner import Group
from sandrl.tasks.task import Task
from sandrl.train.run_config import RunConfig, from_dict
from sandrl.wiring import build_runner, open_provider, task_set

TARGET_PCT = 5.0
GROUP_SIZE = 2
COMMANDS: tuple[str, ...] = ("ls -la", "cat /etc/os-release | head -n 3", SOLUTION)
"""Each episode: look, read, solve (so the verifier has something to pass)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalHost:
    """A ``sandrl serve sandboxes`` process on a loopback port, stopped by its pid."""

    def __init__(self, name: str, root: Path, token_file: Path) -> None:
        self.name = name
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = root / f"host-{name}.log"
        sandrl = Path(sys.executable).with_name("sandrl")
        args = [str(sandrl), "serve", "sandboxes", "--port", str(self.port), "--token-file", str(token_file)]
        args += ["--state-dir", str(root / f"state-{name}")]
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=log, stdin=subprocess.DEVNULL)

    def wait(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SandrlError(f"sandbox host {self.name} exited: {self.log.read_text()[-1000:]}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise SandrlError(f"sandbox host {self.name} did not start within {timeout_s:g} s; see {self.log}")

    def stop(self) -> None:
        stop_process(self.proc, grace_s=60)


def _run_config(root: Path, tasks: int) -> RunConfig:
    return from_dict(
        {
            "run": {"output_dir": str(root / "run")},
            "tasks": {"family": "echo", "count": tasks},
            "rollout": {"group_size": GROUP_SIZE, "max_turns": len(COMMANDS) + 1, "max_attempts": 1},
        }
    )


def _agent(think_s: float) -> ReplayAgent:
    tokens = max(1, round(think_s * 100))
    return ReplayAgent(list(COMMANDS), ThinkTime(tokens, tokens, 100.0))


async def _timed(groups: Sequence[tuple[Task, str]], run: Callable[[Task, str], Awaitable[Group]]) -> dict[str, Any]:
    async def one(task: Task, gid: str) -> tuple[float, Group]:
        start = time.monotonic()
        group = await run(task, gid)
        return time.monotonic() - start, group

    start = time.monotonic()
    done = await asyncio.gather(*(one(t, g) for t, g in groups))
    wall = time.monotonic() - start
    latencies = [lat for lat, _ in done]
    trajectories = [t for _, g in done for t in g.trajectories]
    inside = [max(t.timings.queue_s + t.timings.total_s for t in g.trajectories) for _, g in done]
    n = len(trajectories)
    dispatch = sum(max(0.0, lat - ins) for lat, ins in zip(latencies, inside, strict=True)) / len(latencies)
    transport = sum(max(0.0, t.timings.sandbox_wait_s - t.timings.command_s) for t in trajectories) / n
    runner = sum(t.timings.overhead_s for t in trajectories) / n
    return {
        "wall_s": round(wall, 3),
        "group_latency_s": round(sum(latencies) / len(latencies), 4),
        "group_inside_s": round(sum(inside) / len(inside), 4),
        "episode_s": round(sum(t.timings.total_s for t in trajectories) / n, 4),
        "model_s": round(sum(t.timings.model_s for t in trajectories) / n, 4),
        "command_s": round(sum(t.timings.command_s for t in trajectories) / n, 4),
        "overhead_s": {
            "dispatch": round(dispatch, 5),
            "transport": round(transport, 5),
            "runner": round(runner, 5),
            "total": round(dispatch + transport + runner, 5),
        },
        "episodes": len(trajectories),
        "infra_errors": sum(t.status == "infra_error" for t in trajectories),
        "passed": sum(bool(t.passed) for t in trajectories),
        "sandbox_ids": [t.sandbox_id or "" for t in trajectories],
    }


async def _in_process(root: Path, config: RunConfig, tasks: list[Task], groups: int, slots: int, think_s: float) -> Any:
    # The runner a rollout worker builds from the same config, on one machine.
    rollout = dataclasses.replace(config.rollout, concurrency=slots)
    async with open_provider(rollout, state_dir=root / "state-local") as provider:
        runner = build_runner(rollout, provider, agent=_agent(think_s), run_id="bench-local")
        for task in tasks:
            await runner.image_for(task)
        await runner.run_group(tasks[0], "bench-local/warmup")
        plan = [(tasks[i % len(tasks)], f"bench-local/{tasks[i % len(tasks)].id}#{i}") for i in range(groups)]
        return await _timed(plan, runner.run_group)


async def _on_ray(
    root: Path,
    config: RunConfig,
    tasks: list[Task],
    groups: int,
    slots: int,
    think_s: float,
    address: str | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    from sandrl.cluster.training import require_ray, summarize_workers

    require_ray()
    import ray

    from sandrl.cluster import ray as cluster_ray
    from sandrl.cluster.config import ClusterOptions
    from sandrl.cluster.worker import WorkerSpec, concurrency_shares

    token_file = root / "token"
    token_file.write_text(secrets.token_hex(24))
    token_file.chmod(0o600)
    hosts = [LocalHost(name, root, token_file) for name in ("host-a", "host-b")]
    joined = False
    handles: list[Any] = []
    try:
        for host in hosts:
            host.wait()
        if address is None:
            ray.init(
                num_cpus=4,
                object_store_memory=80 << 20,
                include_dashboard=False,
                namespace=cluster_ray.NAMESPACE,
                logging_level=logging.WARNING,
                configure_logging=False,
            )
            joined = True
        else:
            joined = cluster_ray.connect(address)
        shares = concurrency_shares(slots, 2)
        configs = tuple(HostConfig(h.url, name=h.name, capacity=slots / 2, token_file=str(token_file)) for h in hosts)
        specs = [
            WorkerSpec(f"bench-{os.getpid()}-{i}", config, configs, "", share, "bench-ray", agent=_agent(think_s))
            for i, share in enumerate(shares)
        ]
        handles = cluster_ray.start_workers(specs, ClusterOptions(workers=2, worker_cpus=0.5, max_restarts=0))
        await asyncio.gather(*(h.start.remote() for h in handles))
        await asyncio.gather(*(h.run_group.remote(tasks[0].id, f"bench-ray/warmup-{i}") for i, h in enumerate(handles)))

        async def dispatch(task: Task, gid: str) -> Group:
            index = int(gid.rsplit("#", 1)[1])
            group: Group = await handles[index % len(handles)].run_group.remote(task.id, gid)
            return group

        plan = [(tasks[i % len(tasks)], f"bench-ray/{tasks[i % len(tasks)].id}#{i}") for i in range(groups)]
        measured = await _timed(plan, dispatch)
        records = [await h.metrics.remote() for h in handles]
        return measured, summarize_workers(records)
    finally:
        if handles:
            cluster_ray.stop(handles)
        if joined:
            cluster_ray.disconnect()
        for host in hosts:
            host.stop()


def _pct(part: float, whole: float) -> float:
    return round(100.0 * part / whole, 3) if whole > 0 else float("nan")


async def run(
    *,
    episodes: int = 32,
    concurrency: int = 16,
    think_s: float = 2.0,
    address: str | None = None,
    console: Console | None = None,
) -> dict[str, Any]:
    """The benchmark; the JSON line's dict."""
    console = console or Console(stderr=True)
    if episodes < GROUP_SIZE or concurrency < 2 or think_s <= 0:
        raise ConfigError(f"--episodes must be >= {GROUP_SIZE}, --concurrency >= 2 and --think-s > 0")
    groups = episodes // GROUP_SIZE
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sandrl-bench-cluster-") as tmp:
        root = Path(tmp)
        config = _run_config(root, 16)
        tasks = task_set(config.tasks, root / "tasks")
        console.print(
            f"{groups * GROUP_SIZE} replay episodes ({len(COMMANDS)} turns, {think_s:g} s model time each), "
            f"{concurrency} at once: in process, then on Ray with two sandbox hosts"
        )
        local = await _in_process(root, config, tasks, groups, concurrency, think_s)
        on_ray, hosts = await _on_ray(root, config, tasks, groups, concurrency, think_s, address)
    ids = on_ray.pop("sandbox_ids")
    per_host = {name: sum(s.startswith(name + "/") for s in ids) for name in hosts}
    local.pop("sandbox_ids")
    overhead = on_ray["overhead_s"]["total"]
    dispatch = on_ray["overhead_s"]["dispatch"]
    base = on_ray["episode_s"]
    result: dict[str, Any] = {
        "bench": "cluster",
        "cpus": os.cpu_count(),
        "episodes": groups * GROUP_SIZE,
        "group_size": GROUP_SIZE,
        "concurrency": concurrency,
        "turns": len(COMMANDS),
        "think_s": think_s,
        "in_process": local,
        "ray": {**on_ray, "workers": 2, "sandbox_hosts": 2, "episodes_per_host": per_host},
        "overhead_s_per_episode": round(overhead, 4),
        "overhead_pct": _pct(overhead, base),
        "overhead_pct_in_process": _pct(local["overhead_s"]["total"], local["episode_s"]),
        "latency_difference_pct": _pct(on_ray["group_latency_s"] - local["group_latency_s"], local["group_latency_s"]),
        "ray_dispatch_s_per_episode": round(dispatch, 4),
        "ray_dispatch_pct": _pct(dispatch, base),
        "target_pct": TARGET_PCT,
        "met": overhead <= TARGET_PCT / 100 * base and on_ray["infra_errors"] == 0 and local["infra_errors"] == 0,
        "hosts": {
            name: {k: v for k, v in h.items() if k in ("placements", "failures", "command_p50_s", "command_p95_s")}
            for name, h in hosts.items()
        },
        "wall_s": round(time.monotonic() - started, 1),
    }
    console.print(render_card(result))
    return result


def render_card(result: dict[str, Any]) -> Table:
    table = Table(title=f"cluster: {result['episodes']} episodes, {result['concurrency']} at once, side by side")
    for column in ("", "in process (1 host)", "Ray (2 workers, 2 hosts)"):
        table.add_column(column, justify="right")
    local, ray = result["in_process"], result["ray"]
    rows = (
        ("episode time, mean s", "episode_s"),
        ("  model, mean s", "model_s"),
        ("  commands (as the sandbox timed them), mean s", "command_s"),
        ("group latency in the driver, mean s", "group_latency_s"),
        ("group time inside the runner, mean s", "group_inside_s"),
        ("wall s", "wall_s"),
        ("infra errors", "infra_errors"),
        ("passed", "passed"),
    )
    for label, key in rows:
        table.add_row(label, str(local[key]), str(ray[key]))
    for part in ("dispatch", "transport", "runner", "total"):
        table.add_row(
            f"overhead: {part}, mean ms",
            f"{local['overhead_s'][part] * 1000:.1f}",
            f"{ray['overhead_s'][part] * 1000:.1f}",
        )
    table.caption = (
        f"orchestration overhead on Ray {result['overhead_s_per_episode'] * 1000:.1f} ms per episode = "
        f"{result['overhead_pct']:.2f}% of episode time (target <= {result['target_pct']:g}%; in process "
        f"{result['overhead_pct_in_process']:.2f}%); end-to-end latency difference "
        f"{result['latency_difference_pct']:+.1f}%; episodes per host {ray['episodes_per_host']}"
    )
    return table
