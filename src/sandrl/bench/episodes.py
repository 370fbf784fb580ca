"""``sandrl bench episodes``: where an episode's time goes on a busy host, with the model held fixed.

M episodes of built-in tasks run through the :class:`~sandrl.rollout.runner.RolloutRunner`
with real sandboxes and the real verifier, while N background tasks (the contention sweep's
:class:`~sandrl.bench.contention.BackgroundLoad`) keep the host busy. The agent is the
:class:`~sandrl.rollout.agents.scripted.ReplayAgent`: each episode replays the turns an agent takes on
the task (:data:`REPLAY_TURNS`: look, read, try the build or the tests, the task's reference
solution, check again), each after the same emulated model time, so two hosts differ only in
what their CPUs do. Per episode and averaged: total, model, commands, verifier, sandbox create
(:class:`~sandrl.bench.breakdown.EpisodeBreakdown`), the idle KV-cache fraction, and the
projection for faster inference.

Tokens are emulated for the KV cache (the replay agent has no model): the prompt holds
``prompt_tokens`` plus the instruction (4 characters a token), each turn's output is
``model_s * tokens_per_s`` tokens, and each observation adds ``observation_tokens``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from sandrl.bench import hostlimit, workloads
from sandrl.bench.breakdown import EpisodeBreakdown, episodes_section, kv_turns, kv_usage, mean
from sandrl.bench.contention import BackgroundLoad
from sandrl.bench.projection import projection_section
from sandrl.errors import ConfigError
from sandrl.progress import Progress
from sandrl.rollout.agents.scripted import SOLUTION, ReplayAgent, ThinkTime
from sandrl.rollout.trajectory import Trajectory, Turn
from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.tasks.builtin import SUITE_DIR
from sandrl.tasks.loader import load_tasks
from sandrl.tasks.task import Task
from sandrl.wiring import RolloutConfig, build_runner

RESULT_VERSION = 1

LOOK = "ls -la && find . -maxdepth 3 -type f -not -path './.git/*' | sort | head -n 60"
READ = (
    "for f in $(find . -maxdepth 3 -type f \\( -name '*.py' -o -name '*.c' -o -name '*.h' -o -name Makefile "
    "-o -name '*.sh' -o -name '*.yaml' -o -name '*.csv' -o -name '*.conf' \\) -not -path './.git/*' | sort | "
    'head -n 8); do echo "== $f"; head -n 80 "$f"; done; true'
)
TRY = (
    'if [ -f Makefile ]; then make -s -j"$(nproc)" 2>&1 | tail -n 20; '
    "elif [ -d tests ]; then python3 -m pytest -q -p no:cacheprovider 2>&1 | tail -n 15; "
    "elif [ -d .git ]; then git status --short && git log --oneline | head -n 20; "
    "else ls -R | head -n 40; fi; true"
)
"""Build or test what is there, as an agent does before and after a change (failures are expected before)."""
REPLAY_TURNS: tuple[str, ...] = (LOOK, READ, TRY, SOLUTION, TRY)
"""Every episode's turns: look around, read the sources, try, the reference solution, check."""

DEFAULT_TASKS: tuple[str, ...] = (
    "build-header-dependencies",
    "c-multi-file-makefile",
    "c-implement-strutil",
    "fix-calendar-leap-years",
    "fix-lru-cache-eviction",
    "implement-semver-sort",
    "git-find-breaking-commit",
    "shell-log-levels-by-day",
)
"""Compile, Python, git and shell work, as the study's agents did; every one passes with its solution."""
QUICK_TASKS: tuple[str, ...] = (
    "c-multi-file-makefile",
    "c-implement-strutil",
    "fix-calendar-leap-years",
    "git-find-breaking-commit",
)


@dataclass(frozen=True)
class EpisodesConfig:
    """What the episode run measures; None fields are filled in by :meth:`resolve`."""

    quick: bool = False
    """The small run (under 3 minutes on 2 cores): fewer tasks and episodes, 1 s of model time per turn."""
    episodes: int | None = None
    """Episodes in all (the tasks round-robin); default 8 quick, 24 full."""
    tasks: tuple[str, ...] | None = None
    """Built-in task ids (``all``: every one); default :data:`QUICK_TASKS` quick, :data:`DEFAULT_TASKS` full."""
    background: int | None = None
    """Background tasks busy during the run; default the emulated host's cores (one per core)."""
    model_s: float | None = None
    """Emulated model time per turn, the same on every host; default 1 s quick, 2 s full."""
    tokens_per_s: float = 50.0
    """Decode speed of the emulated inference server: a turn's output is ``model_s * tokens_per_s`` tokens."""
    prompt_tokens: int = 1024
    """System prompt and tool descriptions, before the instruction's own tokens."""
    observation_tokens: int = 256
    """Tokens each command's output adds to the context."""
    concurrency: int = 2
    """Episodes at once (on top of the background tasks)."""
    cores: float | None = None
    """The emulated host's cores (``--cpus-per-host``); None: every usable CPU."""
    host_limit: Literal["auto", "affinity", "quota"] = "auto"
    background_workloads: tuple[str, ...] | None = None
    """What the background tasks loop over; default :data:`~sandrl.bench.workloads.QUICK_NAMES`."""
    sandbox_cpus: float = 1.0
    """Each background sandbox's CPU quota (the episodes' come from their tasks: 1 core each)."""
    settle_s: float | None = None
    """Wait after starting the background load; default 1 s quick, 3 s full."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.episodes is not None and self.episodes < 1:
            raise ConfigError("--episodes must be at least 1")
        if self.background is not None and self.background < 0:
            raise ConfigError("--background cannot be negative")
        if self.model_s is not None and not (math.isfinite(self.model_s) and self.model_s >= 0):
            raise ConfigError(f"--model-s must be 0 or more seconds, got {self.model_s}")
        if not (math.isfinite(self.tokens_per_s) and self.tokens_per_s > 0):
            raise ConfigError(f"--tokens-per-s must be positive, got {self.tokens_per_s}")
        if self.concurrency < 1:
            raise ConfigError("--concurrency must be at least 1")
        if self.prompt_tokens < 0 or self.observation_tokens < 0:
            raise ConfigError("token counts cannot be negative")
        if self.tasks is not None and not self.tasks:
            raise ConfigError("--tasks needs at least one task id")
        workloads.select(self.background_workloads or workloads.QUICK_NAMES)

    def resolve(self, cores: float) -> EpisodesConfig:
        return replace(
            self,
            episodes=self.episodes or (8 if self.quick else 24),
            tasks=self.tasks or (QUICK_TASKS if self.quick else DEFAULT_TASKS),
            background=self.background if self.background is not None else math.ceil(cores),
            model_s=self.model_s if self.model_s is not None else (1.0 if self.quick else 2.0),
            background_workloads=self.background_workloads or workloads.QUICK_NAMES,
            settle_s=self.settle_s if self.settle_s is not None else (1.0 if self.quick else 3.0),
            cores=cores,
        )

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for key in ("tasks", "background_workloads"):
            out[key] = list(out[key] or ())
        out["turns"] = list(REPLAY_TURNS)
        return out


def builtin_tasks(names: Sequence[str]) -> list[Task]:
    """The named built-in tasks, in the order given (``all``: every one, sorted)."""
    tasks, problems = load_tasks(SUITE_DIR)
    if problems:
        raise ConfigError(f"the built-in suite did not load: {problems[0]}")
    if list(names) == ["all"]:
        return tasks
    by_id = {t.id: t for t in tasks}
    unknown = [n for n in names if n not in by_id]
    if unknown:
        raise ConfigError(f"no built-in task named {', '.join(unknown)}; `sandrl tasks list` shows them")
    return [by_id[n] for n in names]


def replay_agent(
    model_s: float, tokens_per_s: float, turns: Sequence[str] = REPLAY_TURNS, seed: int = 0
) -> ReplayAgent:
    """The replay agent with exactly ``model_s`` of emulated model time before every turn."""
    tokens = round(model_s * tokens_per_s)
    return ReplayAgent(list(turns), ThinkTime(tokens, tokens, tokens_per_s), seed=seed)


def emulated_turns(
    turns: Sequence[Turn], *, prompt_tokens: int, tokens_per_s: float, observation_tokens: int
) -> list[dict[str, Any]]:
    """``Turn.to_dict()`` records with the emulated token counts filled in (for :func:`kv_turns`)."""
    context = prompt_tokens
    out = []
    for turn in turns:
        output = round(turn.model_s * tokens_per_s)
        out.append({**turn.to_dict(), "context_tokens": context, "output_start": 0, "output_end": output})
        context += output + observation_tokens
    return out


def breakdown(trajectory: Trajectory, task: Task, cfg: EpisodesConfig) -> EpisodeBreakdown:
    """One episode's breakdown, with its emulated KV usage."""
    turns = emulated_turns(
        trajectory.turns,
        prompt_tokens=cfg.prompt_tokens + len(task.instruction) // 4,
        tokens_per_s=cfg.tokens_per_s,
        observation_tokens=cfg.observation_tokens,
    )
    return EpisodeBreakdown.from_timings(trajectory.timings.to_dict(), kv=kv_usage(kv_turns(turns)))


async def run(
    config: EpisodesConfig | None = None,
    *,
    provider: BwrapProvider | None = None,
    state_dir: Path | None = None,
    console: Console | None = None,
) -> dict[str, Any]:
    """Run the episodes under the background load; print the card; return the JSON result."""
    config = config or EpisodesConfig()
    console = console or Console(stderr=True)
    limit = hostlimit.plan(config.cores, config.host_limit, sandbox_cpus=config.sandbox_cpus)
    cfg = config.resolve(limit.cores)
    assert cfg.tasks is not None
    tasks = builtin_tasks(cfg.tasks)
    result = await hostlimit.run_on_host(
        limit, lambda p, _: _run(cfg, tasks, p, console), provider=provider, state_dir=state_dir
    )
    print_card(result, console)
    return result


async def _run(cfg: EpisodesConfig, tasks: list[Task], provider: BwrapProvider, console: Console) -> dict[str, Any]:
    assert cfg.episodes is not None and cfg.background is not None and cfg.model_s is not None
    assert cfg.settle_s is not None and cfg.cores is not None
    chosen = [tasks[i % len(tasks)] for i in range(cfg.episodes)]
    spec = SandboxSpec(cpus=cfg.sandbox_cpus, memory_mb=2048, ttl_s=6 * 3600)
    load = BackgroundLoad(provider, spec, workloads.select(cfg.background_workloads), seed=cfg.seed)
    agent = replay_agent(cfg.model_s, cfg.tokens_per_s, seed=cfg.seed)
    with Progress(console=console, transient=True) as progress:
        bar = progress.add_task(f"{cfg.episodes} episodes, {cfg.concurrency} at once", total=cfg.episodes)
        runner = build_runner(
            RolloutConfig(concurrency=cfg.concurrency, group_size=1, max_attempts=1, max_turns=len(REPLAY_TURNS) + 1),
            provider,
            agent=agent,
            on_episode=lambda _: progress.advance(bar),
        )
        images = progress.add_task("task images", total=len(tasks))
        for task in tasks:  # built before timing, as a training run has them
            await runner.image_for(task)
            progress.advance(images)
        progress.remove_task(images)
        try:
            if cfg.background:
                grow = progress.add_task(f"preparing {cfg.background} background sandboxes", total=cfg.background)
                await load.grow(cfg.background, lambda: progress.advance(grow))
                progress.remove_task(grow)
            await load.resize(cfg.background)
            await asyncio.sleep(cfg.settle_s)
            cpu0, done0, t0 = load.cpu_seconds(), load.commands, time.monotonic()
            outcome = await runner.run(chosen)
            wall = time.monotonic() - t0
            background = {
                "n": cfg.background,
                "per_core": round(cfg.background / cfg.cores, 4),
                "workloads": list(cfg.background_workloads or ()),
                "commands": load.commands - done0,
                "cpu_utilization": round((load.cpu_seconds() - cpu0) / (wall * cfg.cores), 4) if wall > 0 else None,
                "errors": load.errors[:20],
            }
        finally:
            await load.close()
    return _result(cfg, chosen, outcome.trajectories, outcome.summary, outcome.wall_s, background)


def _result(
    cfg: EpisodesConfig,
    tasks: Sequence[Task],
    trajectories: Sequence[Trajectory],
    summary: dict[str, Any],
    wall_s: float,
    background: dict[str, Any],
) -> dict[str, Any]:
    by_id = {t.id: t for t in tasks}
    done = [t for t in trajectories if t.status != "infra_error"]
    if not done:
        first = trajectories[0].error if trajectories else None
        raise ConfigError(
            f"every episode failed on the infrastructure ({first.message if first else 'no episodes'}); "
            "see `sandrl tasks validate` for the tasks"
        )
    breakdowns = [breakdown(t, by_id[t.task_id], cfg) for t in done]
    per_task: dict[str, dict[str, Any]] = {}
    for t, b in zip(done, breakdowns, strict=True):
        per_task.setdefault(t.task_id, {"breakdowns": [], "passed": 0})
        per_task[t.task_id]["breakdowns"].append(b)
        per_task[t.task_id]["passed"] += int(bool(t.passed))
    passed = sum(1 for t in trajectories if t.passed)
    section = episodes_section(
        breakdowns,
        agent="replay",
        turns=list(REPLAY_TURNS),
        model_s_per_turn=cfg.model_s,
        load={"background": cfg.background, "per_core": background["per_core"], "concurrency": cfg.concurrency},
        tasks=list(cfg.tasks or ()),
        episode_tasks=[t.task_id for t in done],
        pass_rate=round(passed / len(trajectories), 4),
        status=summary["status"],
        errors=summary["errors"],
        wall_s=round(wall_s, 3),
        per_task={
            tid: {"n": len(v["breakdowns"]), "passed": v["passed"], "mean": mean(v["breakdowns"]).to_dict()}
            for tid, v in per_task.items()
        },
        kv_model={
            "prompt_tokens": cfg.prompt_tokens,
            "instruction_chars_per_token": 4,
            "tokens_per_s": cfg.tokens_per_s,
            "observation_tokens": cfg.observation_tokens,
        },
    )
    return {
        "bench": "episodes",
        "version": RESULT_VERSION,
        "config": cfg.to_dict(),
        "background": background,
        "episodes": section,
        "projection": projection_section(mean(breakdowns)),
    }


def print_card(result: dict[str, Any], console: Console) -> None:
    """The table people read; the JSON line follows it."""
    host, eps = result["host"], result["episodes"]
    load = eps["load"]
    table = Table(
        title=f"sandrl bench episodes: {host['cpu_model']}, {host['cores']:g} cores "
        f"(limit: {host['host_limit']['mode']}), {load['background']} background tasks, "
        f"{eps['model_s_per_turn']:g} s model per turn",
        caption="seconds, mean episode; commands: the agent's wait on its commands; kv idle: idle share of KV token-s",
    )
    table.add_column("task", no_wrap=True)
    for col in ("passed", "total", "model", "commands", "verifier", "create", "other", "kv idle"):
        table.add_column(col, justify="right", no_wrap=True)

    def add(name: str, passed: str, m: dict[str, Any], style: str | None = None) -> None:
        kv = m["kv"]["idle_fraction"] if m.get("kv") else None
        cells = [f"{m[k]:.2f}" for k in ("total_s", "model_s", "commands_s", "verifier_s", "sandbox_create_s")]
        table.add_row(name, passed, *cells, f"{m['other_s']:.2f}", f"{kv:.1%}" if kv is not None else "-", style=style)

    for tid, v in eps["per_task"].items():
        add(escape(tid), f"{v['passed']}/{v['n']}", v["mean"])
    add("mean episode", f"{eps['pass_rate']:.0%} of {eps['n']}", eps["mean"], style="bold")
    console.print(table)
    bg = result["background"]
    console.print(
        f"background: {bg['n']} tasks ({bg['per_core']:g} per core), {bg['commands']} commands, cores busy "
        f"{bg['cpu_utilization']:.0%} (background only); status {eps['status']}"
        if bg["cpu_utilization"] is not None
        else f"background: {bg['n']} tasks; status {eps['status']}"
    )
    points = result["projection"]["points"]
    console.print(
        "projection (episode s at k x faster inference): "
        + ", ".join(f"k={p['k']:g}: {p['episode_s']:.2f}" for p in points)
    )
    console.print(f"took {result['duration_s']:.0f} s")
