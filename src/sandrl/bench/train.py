"""``sandrl bench train``: the async driver against the sync one, episodes per hour, long-tailed commands.

Both modes run the same config through :func:`~sandrl.train.command.run_training`, the code path
of ``sandrl train``: the tiny model built from its config on the embedded CPU engine, the real
trainer, real bwrap sandboxes and the real verifier on generated ``echo`` tasks. Only the agent
is the benchmark's, :class:`~sandrl.rollout.agents.scripted.LongTailAgent`: it samples a few tokens
from the policy (so every episode carries the weight version it was sampled by), runs one
``sleep`` whose length is drawn from a seeded lognormal
(:class:`~sandrl.rollout.agents.scripted.CommandTimes`; agent commands have a long tail: most are
quick, a few are test suites or builds), and solves the task when its first sampled token is
even, so rewards vary within a group and GRPO has a signal.

Fair by construction: the same tasks in the same order, the same draws (the k-th episode run on
a task sleeps the same time in both modes), the same concurrency (``groups_per_step x group_size``,
one sync batch), the same batch and the same budget (``steps`` training steps, each on
``groups_per_step`` groups). The rate is episodes trained per hour of the run's wall time.

Why async wins: a sync step waits for the slowest of its episodes, then the sandboxes idle
while the trainer steps and the weights load; the async driver keeps every slot busy with the
next groups (at most ``max_staleness`` versions behind) while it trains. Groups that come back
too stale are dropped or regenerated (``--on-stale``) and counted: they cost the async side
episodes it runs but does not train on. Prints a card, then returns the JSON line's dict.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from rich.console import Console
from rich.table import Table

from sandrl.rollout.agents.scripted import CommandTimes, LongTailAgent
from sandrl.rollout.jsonl import read_jsonl
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.train.command import run_training
from sandrl.train.run_config import MODES, RunConfig, from_dict
from sandrl.wiring.runner import local_provider

TARGET_RATIO = 1.5
"""Async episodes per hour over sync's, on this benchmark's long tail."""


@dataclass(frozen=True)
class BenchSettings:
    """One comparison: both modes run these."""

    steps: int = 10
    groups_per_step: int = 2
    group_size: int = 4
    tasks: int = 16
    max_staleness: int = 2
    """With 1 the buffer holds two batches, and a few groups waiting on one slow episode fill it."""
    on_stale: Literal["drop", "regenerate"] = "drop"
    update_interval: int = 1
    max_new_tokens: int = 4
    times: CommandTimes = field(default_factory=CommandTimes)
    seed: int = 0

    @property
    def concurrency(self) -> int:
        """One sync batch: the sync driver can never use more, so neither mode gets more."""
        return self.groups_per_step * self.group_size

    def run_config(self, out: Path) -> RunConfig:
        return from_dict(
            {
                "run": {
                    "output_dir": str(out),
                    "steps": self.steps,
                    "groups_per_step": self.groups_per_step,
                    "seed": self.seed,
                    "resume": False,
                },
                "tasks": {"family": "echo", "count": self.tasks, "seed": self.seed},
                "rollout": {
                    "group_size": self.group_size,
                    "concurrency": self.concurrency,
                    "max_turns": 1,
                    "max_new_tokens": self.max_new_tokens,
                    "max_attempts": 1,
                },
                "async": {
                    "max_staleness": self.max_staleness,
                    "on_stale": self.on_stale,
                    "update_interval": self.update_interval,
                },
                "train": {"lr": 1e-3, "loss": {"loss_type": "dapo"}},
            },
            where="bench train",
        )


QUICK = BenchSettings(steps=2, groups_per_step=2, group_size=2, tasks=4, times=CommandTimes(median_s=0.05, sigma=1.0))
"""A smoke run of a few seconds (the test's): the shape of the result, not a meaningful ratio."""


def options(
    *,
    quick: bool = False,
    steps: int | None = None,
    max_staleness: int | None = None,
    on_stale: str | None = None,
    median_s: float | None = None,
    sigma: float | None = None,
    seed: int = 0,
) -> BenchSettings:
    """The settings of the command line: the defaults (or :data:`QUICK`) with what was given; checked."""
    base = QUICK if quick else BenchSettings()
    times = dataclasses.replace(
        base.times,
        median_s=base.times.median_s if median_s is None else median_s,
        sigma=base.times.sigma if sigma is None else sigma,
        seed=seed,
    )
    settings = dataclasses.replace(
        base,
        steps=base.steps if steps is None else steps,
        max_staleness=base.max_staleness if max_staleness is None else max_staleness,
        on_stale=base.on_stale if on_stale is None else on_stale,  # type: ignore[arg-type]
        times=times,
        seed=seed,
    )
    settings.run_config(Path("unused"))  # the run config's checks, before anything starts
    return settings


async def run_mode(mode: str, settings: BenchSettings, out: Path, provider: BwrapProvider) -> dict[str, Any]:
    """One mode end to end, writing under ``out``; its rate and what it did."""
    config = settings.run_config(out)
    agent = LongTailAgent(settings.times, tokens=settings.max_new_tokens)
    started = time.monotonic()
    last = await run_training(config, mode=mode, provider=provider, agent=agent, console=Console(quiet=True))
    wall_s = time.monotonic() - started
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    ran = read_jsonl(out / "rollouts.jsonl")
    trained = sum(m["groups"] for m in lines) * settings.group_size
    staleness: collections.Counter[str] = collections.Counter()
    for m in lines:
        staleness.update(m["staleness_hist"])
    command_s = sorted(turn.command_s for t in ran for turn in t.turns)
    step_s = [m["step_s"] for m in lines]
    return {
        "steps": last["steps"],
        "wall_s": round(wall_s, 3),
        "episodes_trained": trained,
        "episodes_run": len(ran),
        "episodes_per_hour": round(trained / wall_s * 3600, 1),
        "step_s_mean": round(statistics.fmean(step_s), 3) if step_s else None,
        "stale_dropped": last.get("total_stale_dropped", 0),
        "stale_regenerated": last.get("total_stale_regenerated", 0),
        "staleness_hist": dict(sorted(staleness.items(), key=lambda kv: int(kv[0]))),
        "trainer_idle_s": round(last["total_trainer_idle_s"], 3) if "total_trainer_idle_s" in last else None,
        "infra_errors": last.get("total_infra_errors", 0),
        "weight_version": last["weight_version"],
        "reward_mean": round(statistics.fmean(m["reward_mean"] for m in lines), 4) if lines else None,
        "command_s": _quantiles(command_s),
    }


def _quantiles(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None

    def at(q: float) -> float:
        return round(values[min(len(values) - 1, int(q * len(values)))], 3)

    return {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": round(values[-1], 3)}


async def run(settings: BenchSettings | None = None, *, console: Console | None = None) -> dict[str, Any]:
    """Sync, then async, on the same settings; returns the JSON line's dict."""
    settings = settings or BenchSettings()
    console = console or Console(stderr=True)
    t = settings.times
    console.print(
        f"bench train: {settings.steps} steps x {settings.groups_per_step} groups x {settings.group_size} episodes, "
        f"concurrency {settings.concurrency}; commands lognormal median {t.median_s:g} s sigma {t.sigma:g} "
        f"(mean {t.mean_s:.2f} s, cap {t.cap_s:g} s)"
    )
    started = time.monotonic()
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="sandrl-bench-train-") as tmp:
        root = Path(tmp)
        provider = local_provider(root / "state")
        try:
            # The first run in a process pays for imports, kernels and the task image; neither mode should.
            warm = dataclasses.replace(settings, steps=1, times=CommandTimes(median_s=0.01, sigma=0.0))
            warmup_s = (await run_mode("sync", warm, root / "warmup", provider))["wall_s"]
            for mode in MODES:
                console.print(f"  {mode} ...")
                results[mode] = await run_mode(mode, settings, root / mode, provider)
        finally:
            await provider.close_all()
    sync_rate, async_rate = results["sync"]["episodes_per_hour"], results["async"]["episodes_per_hour"]
    ratio = round(async_rate / sync_rate, 3) if sync_rate else None
    out: dict[str, Any] = {
        "bench": "train",
        "cpus": os.cpu_count(),
        "sync_episodes_per_hour": sync_rate,
        "async_episodes_per_hour": async_rate,
        "ratio": ratio,
        "target_ratio": TARGET_RATIO,
        "met": ratio is not None and ratio >= TARGET_RATIO,
        "settings": {
            **{k: v for k, v in asdict(settings).items() if k != "times"},
            "concurrency": settings.concurrency,
            "model": "tiny",
            "inference": "embedded",
            "tasks_family": "echo",
            "command_times": {"dist": "lognormal", **asdict(t), "mean_s": round(t.mean_s, 3)},
        },
        "sync": results["sync"],
        "async": results["async"],
        "warmup_s": warmup_s,
        "duration_s": round(time.monotonic() - started, 3),
    }
    console.print(render_card(out))
    return out


def render_card(result: dict[str, Any]) -> Table:
    table = Table(title=f"train: async vs sync, {result['settings']['steps']} steps each ({result['cpus']} CPUs)")
    rows = (
        ("episodes / hour", "episodes_per_hour"),
        ("wall s", "wall_s"),
        ("mean step s", "step_s_mean"),
        ("episodes trained", "episodes_trained"),
        ("episodes run", "episodes_run"),
        ("stale dropped", "stale_dropped"),
        ("stale regenerated", "stale_regenerated"),
        ("trainer idle s", "trainer_idle_s"),
        ("infra errors", "infra_errors"),
    )
    table.add_column("")
    for mode in MODES:
        table.add_column(mode, justify="right")
    for label, key in rows:
        table.add_row(label, *(str(result[mode][key]) for mode in MODES))
    table.add_row("staleness", *(str(result[mode]["staleness_hist"]) for mode in MODES))
    ratio = result["ratio"]
    table.caption = f"async / sync = {ratio}x (target >= {result['target_ratio']}x)" if ratio else "no sync rate"
    return table
