"""Capacity-aware admission: the command limit with fakes, then the benchmark with real sandboxes.

The fakes are only at the edge (a provider whose sandboxes sleep instead of running commands);
the runner, the episode, the replay agent and the verifier's reading of the reward are real.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import pytest
from rich.console import Console

from sandrl import capacity
from sandrl.bench import admission, report
from sandrl.bench.admission import AdmissionConfig
from sandrl.bench.workloads import Standalone
from sandrl.errors import CapacityExhaustedError, ConfigError
from sandrl.rollout import Budget, EpisodeConfig, ReplayAgent, RolloutRunner, RunnerConfig, ThinkTime
from sandrl.sandbox.admission import AdmittedProvider, CommandAdmission
from sandrl.sandbox.base import MAX_READ_BYTES, ExecResult, SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.sandbox.idle_cpu import IdleCpus
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

    async def read_file(self, path: str, *, max_bytes: int = MAX_READ_BYTES) -> bytes:
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


class ScriptedIdle:
    """An idle-CPU reading the test sets; counts the restarts admission asks for."""

    window_s = 0.005

    def __init__(self, cores: float) -> None:
        self.cores = cores
        self.restarts = 0

    def idle(self) -> float:
        return self.cores

    def restart(self) -> None:
        self.restarts += 1


async def test_idle_cores_admit_extras_up_to_the_slots_and_give_them_back() -> None:
    host = Host(command_s=0.03)
    idle = ScriptedIdle(cores=1.5)
    gate = CommandAdmission(2, fill_idle=idle)  # type: ignore[arg-type]
    provider = AdmittedProvider(FakeProvider(host), gate)
    sandboxes = [await provider.create(SandboxSpec()) for _ in range(8)]
    await asyncio.gather(*(s.exec(f"cmd {i}") for i, s in enumerate(sandboxes)))
    assert host.peak == 4 and gate.peak_running == 4  # 2 slots + at most 2 extras
    assert gate.extras >= 2 and idle.restarts == gate.extras and gate.stats()["extras"] == gate.extras
    assert host.commands == [f"cmd {i}" for i in range(8)]  # extras are taken from the head of the line
    assert gate.running == 0 and gate.extra_running == 0 and gate._regular == 0


async def test_extras_wait_for_idle_cores_and_a_poll_finds_them() -> None:
    host = Host(command_s=0.2)
    idle = ScriptedIdle(cores=0.5)  # under fill_idle_cores: no extra
    gate = CommandAdmission(1, fill_idle=idle)  # type: ignore[arg-type]
    provider = AdmittedProvider(FakeProvider(host), gate)
    first, second = [await provider.create(SandboxSpec()) for _ in range(2)]
    run_first = asyncio.create_task(first.exec("long"))
    await asyncio.sleep(0.01)
    run_second = asyncio.create_task(second.exec("waits"))
    await asyncio.sleep(0.03)
    assert host.running == 1 and gate.extras == 0 and gate.waiting == 1
    idle.cores = 1.0  # the poll sees it within a window, long before the first command ends
    await asyncio.sleep(0.03)
    assert host.running == 2 and gate.extras == 1 and gate.waiting == 0
    await asyncio.gather(run_first, run_second)
    assert gate._poller is None and gate.running == 0


async def test_without_idle_cores_admission_keeps_to_the_slots() -> None:
    host = Host(command_s=0.01)
    gate = CommandAdmission(1, fill_idle=ScriptedIdle(cores=0.0))  # type: ignore[arg-type]
    provider = AdmittedProvider(FakeProvider(host), gate)
    sandboxes = [await provider.create(SandboxSpec()) for _ in range(5)]
    await asyncio.gather(*(s.exec("x") for s in sandboxes))
    assert host.peak == 1 and gate.extras == 0 and gate.stats()["queued"] == 4


def test_idle_cpus_reads_the_watched_cpus_ticks_per_window(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    now = [0.0]

    def write(cpu0: tuple[int, int], cpu1: tuple[int, int], cpu2: tuple[int, int]) -> None:
        # (busy user ticks, idle ticks) per CPU; iowait counts as idle, guest is inside user
        lines = ["cpu  1 2 3 4 5 6 7 8 9 10"]
        for n, (busy, free) in enumerate((cpu0, cpu1, cpu2)):
            lines.append(f"cpu{n} {busy} 0 0 {free - 1} 1 0 0 0 {busy} 0")
        lines.append("intr 12345")
        stat.write_text("\n".join(lines) + "\n")

    write((100, 100), (100, 100), (0, 0))
    idle = IdleCpus(window_s=0.1, cpus=[0, 1], path=stat, clock=lambda: now[0])
    write((110, 110), (120, 100), (999, 0))  # cpu0 half idle, cpu1 busy; cpu2 is not watched
    now[0] = 0.05
    assert idle.idle() == 0.0  # the window is not over yet
    now[0] = 0.1
    assert idle.idle() == pytest.approx(2 * 10 / 40)
    write((110, 130), (120, 120), (999, 0))  # both idle for the next window
    now[0] = 0.15
    assert idle.idle() == pytest.approx(0.5)  # the last finished window
    now[0] = 0.2
    assert idle.idle() == pytest.approx(2.0)
    idle.restart()
    assert idle.idle() == 0.0
    with pytest.raises(ConfigError, match="none of the CPUs"):
        IdleCpus(cpus=[7], path=stat)
    with pytest.raises(ConfigError, match="window must be positive"):
        IdleCpus(window_s=0)


def test_bad_capacities_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="at least 1"):
        CommandAdmission(0)
    with pytest.raises(ConfigError, match="host_capacity"):
        RunnerConfig(host_capacity=0)
    with pytest.raises(ConfigError, match="fill_idle_cores must be a positive number of cores"):
        RunnerConfig(host_capacity=2, fill_idle_cores=0)
    with pytest.raises(ConfigError, match="--fill-idle-cores must be a positive"):
        AdmissionConfig(fill_idle_cores=-1)
    with pytest.raises(ConfigError, match="idle cores for an extra"):
        CommandAdmission(1, fill_idle_cores=0)
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


def test_the_offered_load_counts_busy_sandboxes_not_episodes() -> None:
    def alone(name: str, seconds: float) -> Standalone:
        return Standalone(name, "python", seconds, (seconds,))

    times = {"a": alone("a", 0.5), "b": alone("b", 0.3), "verifier": alone("verifier", 0.4)}
    # 1.2 s busy against 2 turns x 0.4 s of model time: busy 60% of the time.
    assert admission.duty_cycle(times, 0.4) == pytest.approx(0.6)
    assert admission.duty_cycle(times, 0.0) == 1.0
    config = AdmissionConfig(factor=2.0)
    assert config.in_flight(2, 0.6) == 7  # 4 busy sandboxes need 6.67 episodes that are busy 60% of the time
    assert config.in_flight(2, 1.0) == 4 and config.in_flight(3, 0.5) == 12
    assert config.resolve(2.0, 2).at_load(7).episodes == 14


def test_capacity_from_a_contention_result(tmp_path: Path) -> None:
    result = synthetic_result(2, capacity=1, slow=1.0)
    assert capacity.admission_slots(result) == 2  # one background task plus the probe
    result["capacity"]["load"] = None
    with pytest.raises(ConfigError, match="no capacity"):
        capacity.admission_slots(result)
    path = tmp_path / "hostA.json"
    path.write_text(json.dumps(synthetic_result(2, capacity=3, slow=1.0)))
    assert capacity.parse_capacity(str(path)) == (4, str(path))
    assert capacity.parse_capacity("3") == (3, "given")
    assert capacity.parse_capacity(None) == (None, "measured")
    with pytest.raises(ConfigError, match="at least 1 command at once, got 0"):
        capacity.parse_capacity("0")
    with pytest.raises(ConfigError, match="neither"):
        capacity.parse_capacity(str(tmp_path / "missing.json"))
    episodes_only = {k: v for k, v in synthetic_result(2, capacity=1, slow=1.0).items()}
    episodes_only["bench"] = "episodes"
    path.write_text(json.dumps(episodes_only))
    with pytest.raises(ConfigError, match="the capacity is in a contention one"):
        capacity.parse_capacity(str(path))


@needs_sandbox
async def test_admission_bench_end_to_end(provider: BwrapProvider, tmp_path: Path) -> None:
    """Both ways on real sandboxes, tiny: the result's shape and the limit held, never the timings."""
    config = AdmissionConfig(
        capacity=1,
        capacity_source="given",
        episodes=2,
        rounds=2,
        model_s=0.0,
        workloads=("cpu_script", "sort_uniq"),
        repeats=1,
        fill_idle_cores=1.0,  # the work-conserving path, on the real /proc/stat
    )
    console = Console(file=io.StringIO(), width=200)
    result = await admission.run(config, provider=provider, console=console)
    json.dumps(result)
    assert "capacity-aware within the bar" in console.file.getvalue()  # type: ignore[attr-defined]
    assert result["bench"] == "admission" and result["host"]["sandbox_backend"] == "bwrap"
    assert result["capacity"] == {"slots": 1, "source": "given"}
    assert result["offered"]["episodes_in_flight"] == 2 and result["offered"]["duty"] == 1.0  # no model time
    assert set(result["standalone"]) == {"cpu_script", "sort_uniq", "verifier"}
    a, b = result["admit_all"], result["capacity_aware"]
    for way in (a, b):
        assert way["episodes"] == 4 and way["verified"] == 4 and way["passed"] == 4 and way["infra_errors"] == 0
        assert way["slowdown"]["all"]["n"] == 8.0 and {"python", "shell"} <= set(way["slowdown"])
        assert [r["round"] for r in way["per_round"]] == [0, 1]
        assert 0 < way["cpu_busy_cores_mean"] <= result["host"]["cores"] and way["cpu_s_per_episode"] > 0
    assert a["peak_running"] is None and a["queued_fraction"] == 0.0 and a["extras"] is None
    assert 1 <= b["peak_running"] <= 1 + min(1, b["extras"])  # the slot, and at most one extra on an idle core
    assert result["ratios"]["episodes_per_hour_b_over_a"] == pytest.approx(
        b["episodes_per_hour"] / a["episodes_per_hour"], rel=1e-3
    )
    assert set(result["claims"]) == {
        "capacity_aware_within_bar",
        "admit_all_within_bar",
        "episodes_per_hour_b_ge_a",
        "shown",
    }
    # The result file is one `sandrl bench report` renders (and `compare` refuses, saying why).
    path = tmp_path / "admission.json"
    path.write_text(json.dumps(result))
    page = report.render_html(report.load_labelled([path]))
    assert re.search(r'<img id="plot-admission" class="plot" alt="[^"]*" src="data:image/png;base64,', page)
    assert "capacity-aware (b)" in page and "CPU s per episode" in page
    assert '<p class="missing" id="plot-slowdown">' in page  # no contention levels in it
    with pytest.raises(ConfigError, match="compares its two ways itself"):
        report.compare_files(path, path)
