"""Capacity-aware admission: the command limit with fakes, then the benchmark with real sandboxes.

The fakes are only at the edge (a provider whose sandboxes sleep instead of running commands);
the runner, the episode, the replay agent and the verifier's reading of the reward are real.
"""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import pytest
from rich.console import Console

from sandrl.bench import admission, capacity
from sandrl.bench.admission import AdmissionConfig
from sandrl.errors import CapacityExhaustedError, ConfigError
from sandrl.rollout import Budget, EpisodeConfig, ReplayAgent, RolloutRunner, RunnerConfig, ThinkTime
from sandrl.sandbox.base import ExecResult, SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.sandbox.pool import AdmittedProvider, CommandAdmission
from sandrl.tasks import Task, load_tasks
from sandrl.tasks.builtin.generated import generate_tasks

from ..support import needs_sandbox
from .conftest import synthetic_result


@dataclass
class Host:
    """What the fake sandboxes did: commands running now, the most at once, every command."""

    command_s: float = 0.05
    running: int = 0
    peak: int = 0
    commands: list[str] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)


class FakeSandbox:
    def __init__(self, host: Host, n: int) -> None:
        self.host = host
        self.id = f"fake-{n}"
        self.closed = False

    async def exec(
        self,
        command: str,
        *,
        timeout_s: float = 60,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        self.host.running += 1
        self.host.peak = max(self.host.peak, self.host.running)
        self.host.commands.append(command)
        try:
            started = time.monotonic()
            await asyncio.sleep(self.host.command_s)
            return ExecResult(0, "", "", time.monotonic() - started, False, False)
        finally:
            self.host.running -= 1

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        self.host.files[path] = data

    async def read_file(self, path: str) -> bytes:
        if path.endswith("reward.txt"):
            return b"1\n"
        return self.host.files[path]

    async def close(self) -> None:
        self.closed = True

    async def __aenter__(self) -> FakeSandbox:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


class FakeProvider:
    def __init__(self, host: Host) -> None:
        self.host = host
        self.made: list[FakeSandbox] = []

    async def create(self, spec: SandboxSpec) -> FakeSandbox:
        sandbox = FakeSandbox(self.host, len(self.made))
        self.made.append(sandbox)
        return sandbox


async def test_at_most_slots_run_and_the_rest_queue_in_order() -> None:
    host = Host(command_s=0.02)
    gate = CommandAdmission(2)
    provider = AdmittedProvider(FakeProvider(host), gate)
    sandboxes = [await provider.create(SandboxSpec()) for _ in range(3)]
    order: list[int] = []

    async def one(i: int) -> None:
        await sandboxes[i % 3].exec(f"cmd {i}")
        order.append(i)

    await asyncio.gather(*(one(i) for i in range(8)))
    assert host.peak == 2 and gate.peak_running == 2
    assert host.commands == [f"cmd {i}" for i in range(8)]  # first come, first served
    stats = gate.stats()
    assert stats["admitted"] == 8 and stats["queued"] == 6 and stats["peak_waiting"] == 6
    assert stats["wait_s_max"] >= 0.03 and gate.running == 0 and gate.waiting == 0


async def test_files_and_close_pass_straight_through() -> None:
    host = Host()
    gate = CommandAdmission(1)
    sandbox = await AdmittedProvider(FakeProvider(host), gate).create(SandboxSpec())
    async with gate.slot():  # every slot taken: files do not wait for one
        await asyncio.wait_for(sandbox.write_file("/x", b"data"), 1)
        assert await asyncio.wait_for(sandbox.read_file("/x"), 1) == b"data"
    async with sandbox:
        assert sandbox.id == "fake-0"
    assert sandbox.inner.closed  # type: ignore[attr-defined]


async def test_a_wait_is_bounded_and_a_cancelled_waiter_frees_nothing() -> None:
    gate = CommandAdmission(1, wait_timeout_s=0.05)
    async with gate.slot():
        with pytest.raises(CapacityExhaustedError, match=r"waited 0\.05 s for one of the host's 1 command slots"):
            async with gate.slot():
                pass

        async def enter() -> None:
            async with gate.slot():
                pass

        waiter = asyncio.create_task(enter())
        await asyncio.sleep(0.01)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert gate.waiting == 0 and gate.running == 1
    async with gate.slot() as waited:  # the slot came back
        assert waited < 0.05


def test_bad_capacities_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="at least 1"):
        CommandAdmission(0)
    with pytest.raises(ConfigError, match="host_capacity"):
        RunnerConfig(host_capacity=0)
    with pytest.raises(ConfigError, match="--capacity must be at least 1"):
        AdmissionConfig(capacity=0)
    with pytest.raises(ConfigError, match="--factor"):
        AdmissionConfig(factor=0.5)
    with pytest.raises(ConfigError, match="no workload named"):
        AdmissionConfig(workloads=("nope",))


@pytest.fixture(scope="module")
def echo_tasks(tmp_path_factory: pytest.TempPathFactory) -> list[Task]:
    root = tmp_path_factory.mktemp("admission-tasks")
    generate_tasks(root, "echo", 6, seed=0)
    tasks, problems = load_tasks(root)
    assert not problems
    return tasks


@pytest.mark.parametrize("limit", [None, 2])
async def test_the_runner_admits_commands_up_to_the_host_capacity(echo_tasks: list[Task], limit: int | None) -> None:
    """Six episodes in flight, three commands each (setup, replay, verifier...); at most ``limit`` run at once."""
    host = Host(command_s=0.03)

    async def image_for(task: Task) -> str:
        return "host"

    runner = RolloutRunner(
        FakeProvider(host),
        ReplayAgent(["step 1", "step 2"], ThinkTime(0, 0)),
        config=RunnerConfig(concurrency=6, max_attempts=1, host_capacity=limit, episode=EpisodeConfig(Budget())),
        image_for=image_for,
    )
    result = await runner.run(echo_tasks)
    assert result.summary["status"]["completed"] == 6 and result.summary["pass_rate"] == 1.0
    assert host.commands.count("step 1") == 6
    if limit is None:
        assert runner.admission is None and host.peak == 6
    else:
        assert runner.admission is not None and host.peak == limit
        stats = runner.admission.stats()
        assert stats["peak_running"] == limit and stats["admitted"] == len(host.commands) and stats["queued"] > 0
        # Queueing is the agent's wait, not the command's run time.
        turns = [turn for t in result.trajectories for turn in t.turns]
        assert max(turn.sandbox_wait_s - turn.command_s for turn in turns) > 0.02


def test_capacity_from_a_contention_result(tmp_path: Path) -> None:
    result = synthetic_result(2, capacity=1, slow=1.0)
    assert capacity.admission_slots(result) == 2  # one background task plus the probe
    result["capacity"]["load"] = None
    with pytest.raises(ConfigError, match="no capacity"):
        capacity.admission_slots(result)
    path = tmp_path / "hostA.json"
    path.write_text(json.dumps(synthetic_result(2, capacity=3, slow=1.0)))
    assert admission.parse_capacity(str(path)) == (4, str(path))
    assert admission.parse_capacity("3") == (3, "given")
    assert admission.parse_capacity(None) == (None, "measured")
    with pytest.raises(ConfigError, match="neither"):
        admission.parse_capacity(str(tmp_path / "missing.json"))
    episodes_only = {k: v for k, v in synthetic_result(2, capacity=1, slow=1.0).items()}
    episodes_only["bench"] = "episodes"
    path.write_text(json.dumps(episodes_only))
    with pytest.raises(ConfigError, match="the capacity is in a contention one"):
        admission.parse_capacity(str(path))


@needs_sandbox
async def test_admission_bench_end_to_end(provider: BwrapProvider) -> None:
    """Both ways on real sandboxes, tiny: the result's shape and the limit held, never the timings."""
    config = AdmissionConfig(
        capacity=1,
        capacity_source="given",
        episodes=2,
        rounds=2,
        model_s=0.0,
        workloads=("cpu_script", "sort_uniq"),
        repeats=1,
    )
    console = Console(file=io.StringIO(), width=200)
    result = await admission.run(config, provider=provider, console=console)
    json.dumps(result)
    assert "capacity-aware within the bar" in console.file.getvalue()  # type: ignore[attr-defined]
    assert result["bench"] == "admission" and result["host"]["sandbox_backend"] == "bwrap"
    assert result["capacity"] == {"slots": 1, "source": "given"}
    assert result["offered"]["episodes_in_flight"] == 2
    assert set(result["standalone"]) == {"cpu_script", "sort_uniq"}
    a, b = result["admit_all"], result["capacity_aware"]
    for way in (a, b):
        assert way["episodes"] == 4 and way["verified"] == 4 and way["passed"] == 4 and way["infra_errors"] == 0
        assert way["slowdown"]["all"]["n"] == 8.0 and {"python", "shell"} <= set(way["slowdown"])
        assert [r["round"] for r in way["per_round"]] == [0, 1]
    assert b["peak_running"] == 1 and a["peak_running"] is None and a["queued_fraction"] == 0.0
    assert result["ratios"]["episodes_per_hour_b_over_a"] == pytest.approx(
        b["episodes_per_hour"] / a["episodes_per_hour"], rel=1e-3
    )
    assert set(result["claims"]) == {
        "capacity_aware_within_bar",
        "admit_all_within_bar",
        "episodes_per_hour_b_ge_a",
        "shown",
    }
