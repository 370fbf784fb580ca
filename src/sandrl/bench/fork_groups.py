"""``sandrl bench rollout --fork-groups``: GRPO groups on a setup-heavy task, forked against set up per episode.

The same tasks (:mod:`.setup_heavy`: a setup that waits, computes and writes files), the same
replay agent and model time, the same concurrency, run twice in one invocation on one provider:
first with every episode setting up its own sandbox, then with ``fork_groups`` (the setup runs
once per group, the episodes start from its snapshot, :mod:`sandrl.rollout.forks`). The result is
episodes per hour of each and their ratio; a pass rate below 1 or an infra error in either run
says the comparison is void. On a host shared with other work the ratio moves with the load.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from sandrl.bench.setup_heavy import load_setup_heavy, write_task
from sandrl.errors import ConfigError
from sandrl.rollout.agents.scripted import SOLUTION, ReplayAgent, ThinkTime
from sandrl.rollout.runner import RunResult
from sandrl.sandbox.base import SandboxProvider
from sandrl.tasks.task import Task
from sandrl.wiring import RolloutConfig, build_runner, open_provider

COMMANDS = ("ls -la data", SOLUTION)
"""What each episode replays: look at what the setup made, then answer from it."""


async def _run(provider: SandboxProvider, tasks: list[Task], rollout: RolloutConfig, agent: ReplayAgent) -> RunResult:
    runner = build_runner(rollout, provider, agent=agent)
    for task in tasks:
        await runner.image_for(task)  # images first: both runs start from built images
    return await runner.run(tasks)


def _mode(result: RunResult, episodes: int) -> dict[str, Any]:
    summary = result.summary
    setups = summary.get("forked_groups", {}).get("groups", episodes)
    return {
        "wall_s": round(result.wall_s, 3),
        "episodes_per_hour": round(episodes / result.wall_s * 3600, 1),
        "setups": setups,
        "pass_rate": summary["pass_rate"],
        "infra_errors": summary["status"]["infra_error"],
        "setup_s_p50": summary.get("forked_groups", {}).get("setup_s", summary["phases_s"]["setup_s"])["p50"],
        "episode_total_s_p50": summary["phases_s"]["total_s"]["p50"],
        "create_s_p50": summary["phases_s"]["sandbox_create_s"]["p50"],
    }


async def run(
    groups: int = 4,
    group_size: int = 8,
    concurrency: int = 16,
    *,
    wait_s: float = 1.0,
    rounds: int = 3_000_000,
    data_mb: int = 16,
    think_s: tuple[float, float] = (0.5, 1.0),
    sandboxes: str = "local",
    console: Console | None = None,
) -> dict[str, Any]:
    """The benchmark; returns the JSON line's dict."""
    console = console or Console(stderr=True)
    if groups < 1 or group_size < 1 or concurrency < 1 or rounds < 1 or data_mb < 0 or wait_s < 0:
        raise ConfigError("groups, group_size, concurrency and rounds must be at least 1; data_mb and wait_s >= 0")
    low, high = think_s
    agent = ReplayAgent(list(COMMANDS), ThinkTime(round(low * 100), round(high * 100), 100.0))
    episodes = groups * group_size
    base = RolloutConfig(
        concurrency=concurrency,
        group_size=group_size,
        max_attempts=1,
        max_turns=len(COMMANDS) + 1,
        sandboxes=sandboxes,
    )
    with tempfile.TemporaryDirectory(prefix="sandrl-bench-forks-") as tmp:
        root = Path(tmp)
        tasks = [
            load_setup_heavy(
                write_task(root / "tasks", f"setup-heavy-{i}", wait_s=wait_s, rounds=rounds, data_mb=data_mb, seed="s")
            )
            for i in range(groups)
        ]
        console.print(
            f"{groups} groups of {group_size}, {concurrency} episodes at once; each setup waits {wait_s:g} s, "
            f"hashes {rounds} rounds and writes {data_mb} MiB"
        )
        async with open_provider(base, state_dir=root / "state") as provider:
            per_episode = await _run(provider, tasks, base, agent)
            forked = await _run(provider, tasks, dataclasses.replace(base, fork_groups=True), agent)
    out: dict[str, Any] = {
        "bench": "rollout_fork_groups",
        "cpus": os.cpu_count(),
        "groups": groups,
        "group_size": group_size,
        "concurrency": concurrency,
        "setup": {"wait_s": wait_s, "rounds": rounds, "data_mb": data_mb},
        "think_s": [low, high],
        "per_episode_setup": _mode(per_episode, episodes),
        "fork_groups": _mode(forked, episodes),
    }
    out["speedup"] = round(out["fork_groups"]["episodes_per_hour"] / out["per_episode_setup"]["episodes_per_hour"], 3)
    out["valid"] = all(
        out[m]["pass_rate"] == 1.0 and out[m]["infra_errors"] == 0 for m in ("per_episode_setup", "fork_groups")
    )
    console.print(render_card(out))
    return out


def render_card(result: dict[str, Any]) -> Table:
    table = Table(
        title=(
            f"fork groups: {result['groups']} groups of {result['group_size']}, {result['concurrency']} at once "
            f"({result['cpus']} CPUs)"
        )
    )
    for column in ("mode", "episodes/hour", "wall s", "setups", "setup p50 s", "episode p50 s", "pass rate"):
        table.add_column(column, justify="right")
    for mode in ("per_episode_setup", "fork_groups"):
        m = result[mode]
        table.add_row(
            mode.replace("_", " "),
            f"{m['episodes_per_hour']:.0f}",
            f"{m['wall_s']:.1f}",
            str(m["setups"]),
            f"{m['setup_s_p50']:.2f}",
            f"{m['episode_total_s_p50']:.2f}",
            str(m["pass_rate"]),
        )
    table.caption = f"fork groups: {result['speedup']:.2f}x the episodes per hour" + (
        "" if result["valid"] else " (VOID: an episode failed)"
    )
    return table
