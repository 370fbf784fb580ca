"""``sandrl bench rollout``: many concurrent episodes with the model's time held fixed.

256 :class:`~sandrl.rollout.agents.scripted.ReplayAgent` episodes at once on generated (or built-in)
tasks, each turn preceded by 1-2 s of emulated model time, each episode through the full path
(image, sandbox create, setup, commands, verifier, close). The point is the sandbox side and the
orchestrator: zero infra errors, and the orchestrator's own overhead (an episode's total minus
the phases it waits on) under 1% of episode time. Prints a card, then returns the JSON line's dict.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from rich.console import Console
from rich.table import Table

from sandrl.errors import ConfigError
from sandrl.rollout.agents.scripted import SOLUTION, ReplayAgent, ThinkTime
from sandrl.tasks.builtin import SUITE_DIR
from sandrl.tasks.builtin.generated import FAMILIES, generate_tasks
from sandrl.tasks.loader import load_tasks
from sandrl.tasks.task import Task
from sandrl.wiring import RolloutConfig, build_runner, open_provider

TARGETS = {"infra_errors": 0, "overhead_share": 0.01}

COMMANDS: tuple[str, ...] = (
    "ls -la",
    "cat *.txt 2>/dev/null | head -n 20; true",
    "python3 -c 'print(sum(i * i for i in range(200000)))'",
    SOLUTION,
)
"""What each episode replays: look around, read, compute a little, solve (so the verifier has work)."""


def _tasks(suite: Literal["generated", "builtin"], root: Path) -> list[Task]:
    if suite == "builtin":
        tasks, _ = load_tasks(SUITE_DIR)
    else:
        for family in FAMILIES:
            generate_tasks(root, family, 8, seed=0)
        tasks, _ = load_tasks(root)
    if not tasks:
        raise ConfigError(f"no {suite} tasks to run")
    return tasks


async def run(
    episodes: int = 256,
    concurrency: int = 256,
    *,
    suite: Literal["generated", "builtin"] = "generated",
    think_s: tuple[float, float] = (1.0, 2.0),
    tokens_per_s: float = 100.0,
    commands: Sequence[str] = COMMANDS,
    progress: bool = True,
    sandboxes: str = "local",
    console: Console | None = None,
) -> dict[str, Any]:
    """The benchmark; returns the JSON line's dict."""
    console = console or Console(stderr=True)
    if episodes < 1 or concurrency < 1:
        raise ConfigError("episodes and concurrency must be at least 1")
    low, high = think_s
    if not 0 <= low <= high:
        raise ConfigError(f"think_s must be (low, high) with 0 <= low <= high, got {think_s}")
    think = ThinkTime(round(low * tokens_per_s), round(high * tokens_per_s), tokens_per_s)
    agent = ReplayAgent(list(commands), think)
    rollout = RolloutConfig(
        concurrency=concurrency, group_size=1, max_attempts=1, max_turns=len(commands) + 1, sandboxes=sandboxes
    )
    with tempfile.TemporaryDirectory(prefix="sandrl-bench-rollout-") as tmp:
        async with open_provider(rollout, state_dir=Path(tmp) / "state") as provider:
            pool = _tasks(suite, Path(tmp) / "tasks")
            chosen = [pool[i % len(pool)] for i in range(episodes)]
            runner = build_runner(rollout, provider, agent=agent)
            # Images first, so the episode timings are the steady state a training run sees.
            for task in pool:
                await runner.image_for(task)
            console.print(f"{episodes} replay episodes, {concurrency} at once, {low:g}-{high:g} s model time per turn")
            result = await runner.run(chosen, progress=progress)
    summary = result.summary
    trajectories = result.trajectories
    episode_s = sum(t.timings.total_s for t in trajectories)
    out: dict[str, Any] = {
        "bench": "rollout",
        "cpus": os.cpu_count(),
        "episodes": episodes,
        "concurrency": concurrency,
        "suite": suite,
        "turns": len(commands),
        "think_s": [low, high],
        "wall_s": round(result.wall_s, 3),
        "episodes_per_s": round(episodes / result.wall_s, 3),
        "status": summary["status"],
        "infra_errors": summary["status"]["infra_error"],
        "pass_rate": summary["pass_rate"],
        "episode_s_mean": round(episode_s / len(trajectories), 4),
        "overhead_share": summary["overhead_share"],
        "overhead_s_mean": round(sum(t.timings.overhead_s for t in trajectories) / len(trajectories), 6),
        "phases_s": summary["phases_s"],
        "errors": summary["errors"],
        "targets": TARGETS,
    }
    share = out["overhead_share"]
    out["met"] = {
        "zero_infra_errors": out["infra_errors"] == TARGETS["infra_errors"],
        "overhead_under_1pct": share is not None and share < TARGETS["overhead_share"],
    }
    console.print(render_card(out))
    return out


def render_card(result: dict[str, Any]) -> Table:
    table = Table(
        title=(
            f"rollout: {result['episodes']} episodes, {result['concurrency']} at once, "
            f"{result['wall_s']:.1f} s ({result['cpus']} CPUs)"
        )
    )
    for column in ("phase", "p50 s", "p90 s", "p99 s", "max s"):
        table.add_column(column, justify="right")
    for phase, values in result["phases_s"].items():
        table.add_row(phase, *(f"{values[k]:.4f}" for k in ("p50", "p90", "p99", "max")))
    share = result["overhead_share"]
    table.caption = (
        f"infra errors {result['infra_errors']}, pass rate {result['pass_rate']}, "
        f"orchestrator overhead {share:.3%} of episode time"
        if share is not None
        else "no episodes"
    )
    return table
