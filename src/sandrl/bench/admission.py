"""``sandrl bench admission``: at 2x a host's capacity, admit every command, or only up to the capacity.

The host's capacity is the number of busy sandboxes it holds within the latency bar: measured
in the same run by a quick contention sweep (``capacity + 1``, the probe included:
:func:`~sandrl.capacity.admission_slots`), read from a contention result, or given.
Each episode is a :class:`~sandrl.rollout.agents.scripted.ReplayAgent` whose turns are the benchmark's
workloads (:mod:`sandrl.bench.workloads`, in a shuffled order per episode, a short fixed model
time before each), in a task whose image holds the workloads' inputs, with a real verifier (the
pytest suite). The offered load is ``factor x capacity`` *busy sandboxes*, the unit the capacity
is measured in: the sweep's background tasks run commands without a pause, while an episode's
sandbox is busy only for its commands and verifier, not while the model thinks. So
``ceil(factor x capacity / duty)`` episodes stay in flight, where ``duty`` is the busy share of
an episode run alone (:func:`duty_cycle`, from the standalone times). The same episodes run two
ways, in rounds that alternate which goes first (so a drift of the shared host's load hits both):

- **admit all**: every command runs when issued, as a runner without admission does;
- **capacity-aware**: ``RunnerConfig.host_capacity`` = the capacity; commands beyond it wait
  for a slot (:class:`~sandrl.sandbox.admission.CommandAdmission`), and with ``fill_idle_cores``
  set, a waiting command also runs while that many cores sit idle (``RunnerConfig.fill_idle_cores``).

Measured per way: each command's slowdown (its run time in the sandbox over its standalone
time, measured at the start of this run on the idle host, each repetition in a fresh sandbox
as an episode's are: :func:`fresh_standalone`), p95 and the share within the bar;
the agent's wait per command (queueing included) over standalone; episodes per hour.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from rich.console import Console
from rich.progress import TaskID

from sandrl.bench import capacity, contention, hostlimit, workloads
from sandrl.bench.admission_card import print_card
from sandrl.bench.workloads import Standalone, Workload
from sandrl.capacity import admission_slots
from sandrl.errors import ConfigError
from sandrl.progress import Progress
from sandrl.rollout.agents.scripted import ReplayAgent, ThinkTime
from sandrl.rollout.trajectory import Trajectory
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.sandbox.idle_cpu import IdleCpus
from sandrl.tasks.loader import load_task
from sandrl.tasks.task import Task
from sandrl.wiring import RolloutConfig, build_runner

RESULT_VERSION = 1
TASK_ID = "bench-workloads"
MODES = ("admit_all", "capacity_aware")
SWEEP_PROBES = {True: 24, False: 40}
"""Probe commands per level of the capacity sweep (quick, full): 95% allows 1 and 2 outliers."""

DOCKERFILE = f"""FROM host
WORKDIR /workspace
COPY workload_inputs.py /tmp/workload_inputs.py
RUN {workloads.PY} /tmp/workload_inputs.py {workloads.ROOT} && rm /tmp/workload_inputs.py
"""
VERIFIER = Workload(
    "verifier", "python", f"cd proj && {workloads.PY} -m pytest -q -p no:cacheprovider tests > /dev/null"
)
"""What the task's verifier runs (the workloads' pytest suite), timed alone for the duty cycle."""
TEST_SH = f"""#!/bin/bash
# Verifier: the workloads' pytest suite must pass.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
cd {workloads.ROOT} || exit 0
if {VERIFIER.command}; then
    echo 1 > /logs/verifier/reward.txt
fi
"""
TASK_TOML = f"""version = "1.0"

[metadata]
author_name = "sandrl"
author_email = "sandrl@example.invalid"
difficulty = "easy"
category = "benchmark"
tags = ["bench"]

[agent]
timeout_sec = 900.0

[verifier]
timeout_sec = 300.0

[environment]
build_timeout_sec = 300.0
cpus = 1
memory_mb = 2048
storage_mb = 4096
allow_internet = false
workdir = "{workloads.ROOT}"
"""


@dataclass(frozen=True)
class AdmissionConfig:
    """What the admission benchmark runs; None fields are filled in by :meth:`resolve`."""

    quick: bool = False
    """The small run: two rounds instead of four, a smaller capacity sweep."""
    capacity: int | None = None
    """The host's capacity in commands at once (busy sandboxes within the bar); None: measure it."""
    capacity_source: str = "measured"
    """Where ``capacity`` came from: ``measured``, ``given`` or a contention result's path."""
    factor: float = 2.0
    """Offered load: ``factor x capacity`` busy sandboxes, that is ``ceil(factor x capacity / duty)``
    episodes in flight (:func:`duty_cycle`)."""
    episodes: int | None = None
    """Episodes per way per round; default twice the episodes in flight."""
    rounds: int | None = None
    """Rounds, each running both ways (alternating which first); default 2 quick, 4 full."""
    model_s: float = 0.2
    """Emulated model time before every turn: short, so the episodes keep the CPUs asked for."""
    workloads: tuple[str, ...] | None = None
    """Each episode's turns; default :data:`~sandrl.bench.workloads.QUICK_NAMES` (what the quick sweep probes)."""
    bar: float = 1.5
    quantile: float = 0.95
    cores: float | None = None
    host_limit: Literal["auto", "affinity", "quota"] = "auto"
    repeats: int | None = None
    """Standalone repetitions (median); default 3 quick, 5 full."""
    fill_idle_cores: float | None = None
    """Make capacity-aware admission work-conserving: it also runs a waiting command while this
    many of the benchmark process's CPUs sat idle. None (the default): never beyond the capacity.
    Under the ``quota`` host limit those CPUs are the host's, not the quota's, so the extras
    there may exceed the emulated host."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.capacity is not None and self.capacity < 1:
            raise ConfigError(f"--capacity must be at least 1 command at once, got {self.capacity}")
        if not (math.isfinite(self.factor) and self.factor >= 1):
            raise ConfigError(f"--factor must be at least 1, got {self.factor}")
        if self.episodes is not None and self.episodes < 1:
            raise ConfigError("--episodes must be at least 1")
        if self.rounds is not None and self.rounds < 1:
            raise ConfigError("--rounds must be at least 1")
        if not (math.isfinite(self.model_s) and self.model_s >= 0):
            raise ConfigError(f"--model-s must be 0 or more seconds, got {self.model_s}")
        if self.repeats is not None and self.repeats < 1:
            raise ConfigError("--repeats must be at least 1")
        if self.fill_idle_cores is not None and not self.fill_idle_cores > 0:
            raise ConfigError(f"--fill-idle-cores must be a positive number of cores, got {self.fill_idle_cores}")
        contention.ContentionConfig(bar=self.bar, quantile=self.quantile)  # the same checks
        workloads.select(self.workloads or workloads.QUICK_NAMES)

    def in_flight(self, slots: int, duty: float = 1.0) -> int:
        """Episodes in flight whose sandboxes together are busy ``factor x slots`` on average."""
        if not 0 < duty <= 1:
            raise ValueError(f"a duty cycle is in (0, 1], got {duty}")
        return math.ceil(round(self.factor * slots / duty, 6))

    def resolve(self, cores: float, slots: int) -> AdmissionConfig:
        """Every default filled in but ``episodes``, which waits for the load (:meth:`at_load`)."""
        return replace(
            self,
            capacity=slots,
            rounds=self.rounds or (2 if self.quick else 4),
            workloads=self.workloads or workloads.QUICK_NAMES,
            repeats=self.repeats or (3 if self.quick else 5),
            cores=cores,
        )

    def at_load(self, in_flight: int) -> AdmissionConfig:
        """With ``in_flight`` episodes in flight: by default twice that many per way per round."""
        return replace(self, episodes=self.episodes or 2 * in_flight)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["workloads"] = list(self.workloads or ())
        return out


def duty_cycle(standalone: dict[str, Standalone], model_s: float) -> float:
    """The share of an episode run alone during which its sandbox is busy.

    Busy: every workload once and the verifier (:data:`VERIFIER`), at their standalone times;
    idle: the model time before each workload turn. Sandbox start and close (milliseconds)
    are left out.
    """
    busy = sum(s.median_s for s in standalone.values())
    turns = sum(1 for name in standalone if name != VERIFIER.name)
    return busy / (busy + turns * model_s) if busy > 0 else 1.0


def write_task(root: Path) -> Task:
    """The benchmark's task: an image with the workloads' inputs, the pytest suite as its verifier."""
    d = root / TASK_ID
    for sub in ("environment", "tests", "solution"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    (d / "task.toml").write_text(TASK_TOML)
    (d / "instruction.md").write_text("Run the benchmark's workloads in /workspace/bench.\n")
    (d / "environment" / "Dockerfile").write_text(DOCKERFILE)
    (d / "environment" / "workload_inputs.py").write_bytes(workloads.generator_source())
    (d / "tests" / "test.sh").write_text(TEST_SH)
    (d / "solution" / "solve.sh").write_text("#!/bin/bash\ntrue\n")
    return load_task(d)


def episode_tasks(base: Task, n: int, names: Sequence[str], seed: int) -> tuple[list[Task], dict[str, list[str]]]:
    """``n`` copies of the task, each with its own shuffled order of the workloads' commands."""
    chosen = workloads.select(names)
    tasks, orders = [], {}
    for i in range(n):
        rng = random.Random(seed * 100_003 + i)
        order = list(chosen)
        rng.shuffle(order)
        task = replace(base, id=f"{TASK_ID}-{seed}-{i:03d}")
        tasks.append(task)
        orders[task.id] = [w.command for w in order]
    return tasks, orders


async def fresh_standalone(
    provider: BwrapProvider,
    task: Task,
    image: str,
    chosen: Sequence[Workload],
    *,
    repeats: int,
    warmup: int = 1,
    tick: Callable[[], None] = lambda: None,
) -> dict[str, Standalone]:
    """Standalone times as an episode meets its commands: each workload once in a new sandbox of the image.

    An episode's sandbox is fresh, so its first pytest compiles the project's bytecode and its
    first git command refreshes the index; a sandbox that ran them before is faster. Each
    repetition here is a new sandbox running every workload once, alone on the host; the median
    over the repetitions after ``warmup`` (which warms the host's page cache).
    """
    runs: dict[str, list[float]] = {w.name: [] for w in chosen}
    for rep in range(warmup + repeats):
        async with await provider.create(task.to_sandbox_spec(image=image)) as sandbox:
            for w in chosen:
                seconds = await workloads.run(sandbox, w)
                if rep >= warmup:
                    runs[w.name].append(seconds)
                tick()
    return {w.name: Standalone(w.name, w.cls, statistics.median(runs[w.name]), tuple(runs[w.name])) for w in chosen}


def slowdowns(
    trajectories: Sequence[Trajectory], standalone: dict[str, Standalone], by_command: dict[str, Workload]
) -> tuple[list[tuple[str, float]], list[float]]:
    """(class, run time / standalone) and agent wait / standalone of every workload turn."""
    run: list[tuple[str, float]] = []
    wait: list[float] = []
    for t in trajectories:
        for turn in t.turns:
            w = by_command.get(turn.command or "")
            if w is None or (turn.exit_code != 0 and not turn.timed_out):
                continue  # a failed command's time says nothing (they are counted apart); a timeout's does
            alone = standalone[w.name].median_s
            run.append((w.cls, turn.command_s / alone))
            wait.append(turn.sandbox_wait_s / alone)
    return run, wait


@dataclass
class WayRun:
    """One way (admit all or capacity-aware) in one round."""

    mode: str
    round: int
    trajectories: list[Trajectory]
    wall_s: float
    admission: dict[str, Any] | None
    busy_cores: float
    """The benchmark's CPUs busy on average over the way's run (all of the host's work, from /proc/stat)."""


def summarize_way(
    runs: Sequence[WayRun],
    cfg: AdmissionConfig,
    standalone: dict[str, Standalone],
    by_command: dict[str, Workload],
) -> dict[str, Any]:
    trajectories = [t for r in runs for t in r.trajectories]
    wall = sum(r.wall_s for r in runs)
    verified = [t for t in trajectories if t.reward is not None]
    run, wait = slowdowns(trajectories, standalone, by_command)
    values = [s for _, s in run]
    command_s = sum(turn.command_s for t in trajectories for turn in t.turns)
    per_round = []
    for r in runs:
        r_run, _ = slowdowns(r.trajectories, standalone, by_command)
        done = sum(1 for t in r.trajectories if t.reward is not None)
        per_round.append(
            {
                "round": r.round,
                "wall_s": round(r.wall_s, 3),
                "episodes_per_hour": round(done / r.wall_s * 3600, 2) if r.wall_s > 0 else None,
                "p95_slowdown": capacity.summarize([s for _, s in r_run], cfg.bar)["p95"],
                "cpu_busy_cores": round(r.busy_cores, 3),
                "admission": r.admission,
            }
        )
    queued = [r.admission for r in runs if r.admission is not None]
    cpu_s = sum(r.busy_cores * r.wall_s for r in runs)
    return {
        "episodes": len(trajectories),
        "verified": len(verified),
        "passed": sum(1 for t in trajectories if t.passed),
        "infra_errors": sum(1 for t in trajectories if t.status == "infra_error"),
        "failed_commands": sum(
            1 for t in trajectories for turn in t.turns if turn.exit_code != 0 and turn.command in by_command
        ),
        "wall_s": round(wall, 3),
        "episodes_per_hour": round(len(verified) / wall * 3600, 2) if wall > 0 else None,
        "episode_s_mean": round(sum(t.timings.total_s for t in trajectories) / len(trajectories), 4),
        "slowdown": capacity.by_class(run, cfg.bar),
        "p95_slowdown": capacity.summarize(values, cfg.bar)["p95"],
        "within_bar": capacity.summarize(values, cfg.bar)["within_bar"],
        "passes_bar": capacity.passes(values, cfg.bar, cfg.quantile),
        "wait_slowdown": capacity.summarize(wait, cfg.bar),
        "commands_running_mean": round(command_s / wall, 3) if wall > 0 else None,
        "cpu_busy_cores_mean": round(cpu_s / wall, 3) if wall > 0 else None,
        "cpu_s_per_episode": round(cpu_s / len(verified), 3) if verified else None,
        "queued_fraction": (
            round(sum(a["queued"] for a in queued) / max(1, sum(a["admitted"] for a in queued)), 4) if queued else 0.0
        ),
        "queue_wait_s_mean": (
            round(sum(a["wait_s_total"] for a in queued) / max(1, sum(a["admitted"] for a in queued)), 4)
            if queued
            else 0.0
        ),
        "peak_running": max((a["peak_running"] for a in queued), default=None),
        "extras": sum(a["extras"] for a in queued) if queued else None,
        "per_round": per_round,
    }


async def run(
    config: AdmissionConfig | None = None,
    *,
    provider: BwrapProvider | None = None,
    state_dir: Path | None = None,
    console: Console | None = None,
) -> dict[str, Any]:
    """The benchmark; prints the card, returns the JSON line's dict."""
    config = config or AdmissionConfig()
    console = console or Console(stderr=True)
    limit = hostlimit.plan(config.cores, config.host_limit)
    result = await hostlimit.run_on_host(
        limit, lambda p, scratch: _run(config, limit.cores, p, scratch, console), provider=provider, state_dir=state_dir
    )
    print_card(result, console)
    return result


async def _capacity(config: AdmissionConfig, cores: float, provider: BwrapProvider, console: Console) -> dict[str, Any]:
    if config.capacity is not None:
        return {"slots": config.capacity, "source": config.capacity_source}
    # More probes per level than the sweep's quick default (18), so that at 95% one or two slow
    # outliers on a shared host do not decide the capacity on their own.
    # Levels up to one background task per core only (the sweep's 2C level is the slowest to
    # measure); should C pass too, its lower bound (C + 1 busy sandboxes) is used.
    c = max(1, math.ceil(cores))
    cfg = contention.ContentionConfig(
        quick=True,
        levels=tuple(sorted({0, c - 1, c})),
        bar=config.bar,
        quantile=config.quantile,
        probes=SWEEP_PROBES[config.quick],
        seed=config.seed,
    )
    console.print("measuring the host's capacity (a quick contention sweep)")
    swept = await contention._run(cfg.resolve(cores), provider, console)
    cap = swept["capacity"]
    # Even the idle host failing the bar leaves one command at a time as the best admission can do.
    slots = admission_slots(swept) if cap["load"] is not None else 1
    return {
        "slots": slots,
        "source": "measured",
        "contention": {
            k: cap[k] for k in ("load", "bound", "bracket", "bar", "quantile", "per_class", "interval", "diagnosis")
        },
        "levels": [
            {"background": lv["background"], "passed": lv["passed"], "p95": lv["classes"]["all"]["p95"]}
            for lv in swept["levels"]
        ],
    }


async def _run(
    config: AdmissionConfig, cores: float, provider: BwrapProvider, tmp: Path, console: Console
) -> dict[str, Any]:
    cap = await _capacity(config, cores, provider, console)
    slots = cap["slots"]
    cfg = config.resolve(cores, slots)
    assert cfg.repeats is not None and cfg.workloads is not None
    chosen = workloads.select(cfg.workloads)
    by_command = {w.command: w for w in chosen}
    base = write_task(tmp / "tasks")
    runs: list[WayRun] = []
    with Progress(console=console, transient=True) as progress:
        build = progress.add_task("building the task image (the workloads' inputs)", total=None)
        image = await provider.resolve_image(base.image_source())
        progress.remove_task(build)
        alone = progress.add_task("standalone times (idle host)", total=(1 + cfg.repeats) * (len(chosen) + 1))
        standalone = await fresh_standalone(
            provider, base, image, [*chosen, VERIFIER], repeats=cfg.repeats, tick=lambda: progress.advance(alone)
        )
        progress.remove_task(alone)
        duty = duty_cycle(standalone, cfg.model_s)
        in_flight = cfg.in_flight(slots, duty)
        cfg = cfg.at_load(in_flight)
        assert cfg.episodes is not None and cfg.rounds is not None

        async def image_for(task: Task) -> str:
            return image

        for r in range(cfg.rounds):
            tasks, orders = episode_tasks(base, cfg.episodes, cfg.workloads or (), cfg.seed * 1000 + r)
            agent = ReplayAgent(
                functools.partial(_commands_of, orders),
                ThinkTime(1, 1, 1 / cfg.model_s) if cfg.model_s > 0 else ThinkTime(0, 0),
                seed=cfg.seed,
            )
            order = MODES if r % 2 == 0 else MODES[::-1]
            for mode in order:
                bar = progress.add_task(f"round {r + 1}/{cfg.rounds}: {mode.replace('_', ' ')}", total=len(tasks))
                runner = build_runner(
                    RolloutConfig(
                        concurrency=in_flight,
                        group_size=1,
                        max_attempts=1,
                        host_capacity=slots if mode == "capacity_aware" else None,
                        fill_idle_cores=cfg.fill_idle_cores,
                        max_turns=len(chosen) + 1,
                    ),
                    provider,
                    agent=agent,
                    image_for=image_for,
                    on_episode=functools.partial(_advance, progress, bar),
                )
                cpus = IdleCpus()
                outcome = await runner.run(tasks)
                busy = len(cpus.cpus) - cpus.idle()
                progress.remove_task(bar)
                stats = runner.admission.stats() if runner.admission is not None else None
                runs.append(WayRun(mode, r, outcome.trajectories, outcome.wall_s, stats, busy))
                await asyncio.sleep(0)
    ways = {mode: summarize_way([w for w in runs if w.mode == mode], cfg, standalone, by_command) for mode in MODES}
    a, b = ways["admit_all"], ways["capacity_aware"]
    ratios = {
        "episodes_per_hour_b_over_a": _ratio(b["episodes_per_hour"], a["episodes_per_hour"]),
        "p95_slowdown_a_over_b": _ratio(a["p95_slowdown"], b["p95_slowdown"]),
        "episode_s_b_over_a": _ratio(b["episode_s_mean"], a["episode_s_mean"]),
        "episodes_per_hour_b_over_a_per_round": [
            _ratio(rb["episodes_per_hour"], ra["episodes_per_hour"])
            for ra, rb in zip(a["per_round"], b["per_round"], strict=True)
        ],
    }
    claims = {
        "capacity_aware_within_bar": b["passes_bar"],
        "admit_all_within_bar": a["passes_bar"],
        "episodes_per_hour_b_ge_a": (b["episodes_per_hour"] or 0) >= (a["episodes_per_hour"] or 0),
    }
    claims["shown"] = (
        claims["capacity_aware_within_bar"]
        and not claims["admit_all_within_bar"]
        and claims["episodes_per_hour_b_ge_a"]
    )
    return {
        "bench": "admission",
        "version": RESULT_VERSION,
        "config": cfg.to_dict(),
        "capacity": cap,
        "offered": {
            "episodes_in_flight": in_flight,
            "factor": cfg.factor,
            "duty": round(duty, 4),
            "busy_sandboxes": round(in_flight * duty, 3),
            "definition": "episodes in flight = ceil(factor x capacity / duty): their sandboxes are busy factor x "
            "capacity on average; capacity = busy sandboxes (commands at once) within the bar; duty = an "
            "episode's busy share alone (workloads and verifier at standalone times, over that plus model time)",
        },
        "standalone": {name: s.to_dict() for name, s in standalone.items()},
        "admit_all": a,
        "capacity_aware": b,
        "ratios": ratios,
        "claims": claims,
    }


def _commands_of(orders: dict[str, list[str]], task: Task) -> list[str]:
    return orders[task.id]


def _advance(progress: Progress, bar: TaskID, _: Trajectory) -> None:
    progress.advance(bar)


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den == 0:
        return None
    return round(num / den, 4)
