"""``sandrl bench train --estimators``: the held-out gain of each loss on the demo's task family, over seeds.

It lives beside the demo, not in :mod:`sandrl.bench`: it is the demo (:mod:`sandrl.demo.learn`) run
once per loss and seed, and the two packages are independent layers (``tests/test_architecture.py``).

Every row is one ``[train.loss]`` (:data:`ROWS`); everything else is the demo's (``sandrl demo``,
:func:`sandrl.demo.learn.rl_config`): its task family and training tasks, its async GRPO run (steps,
groups, episodes, learning rate and schedule, staleness bound), its tiny model, its held-out tasks
and how they are scored. So a difference between two rows comes from the loss alone:

1. **One warm start** for every row and seed, made as the demo makes it into ``<out>/warm/warm_start``
   (:func:`sandrl.train.warm_run.warm_start_run`); a rerun with the same ``<out>`` reuses it.
2. **Before**: the warm-started policy's held-out pass rate, measured once (every run starts from
   that policy and is scored on the same tasks, sampled the same way).
3. **Each row x each RL seed**: the demo's async RL from the warm start into ``<out>/runs/<row>-seed<k>``,
   then the held-out pass rate of its final checkpoint. The RL seed is ``[run] seed``: the order in
   which the training tasks are drawn (the tasks, the model and the warm start stay the demo's seed's).
   The gain is after - before, in points; a row reports its mean over the seeds with min, max and
   standard deviation.
4. **The off-policy numbers of each async run**, from its ``metrics.jsonl``: the mismatch KL (the k3
   estimate of KL(engine || trainer) over the trained tokens) and the share of tokens the importance
   sampling masked (``mode = "mask"``) or truncated (``mode = "truncate"``), over the whole run
   weighted by each step's trained tokens (exact: the sums of the steps), and by staleness (how many
   weight versions behind the step's update a sample was sampled) weighted by each step's trained
   samples of that staleness (the metrics give each cause's per-token means and sample counts, not its
   token counts).

A measurement, not a target: no verdict, exit 0 when it ran. Prints a card, returns the JSON line's dict.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.table import Table

from sandrl.demo.learn import DemoConfig, heldout_pass_rate, heldout_tasks, rl_config
from sandrl.errors import ConfigError
from sandrl.inference.tiny_config import TinyModelConfig
from sandrl.progress import duration
from sandrl.sandbox.base import SandboxProvider
from sandrl.tasks.task import Task
from sandrl.toml_config import to_table
from sandrl.train import checkpoint
from sandrl.train.command import run_training
from sandrl.train.diagnostics import STALE_CAP
from sandrl.train.loss_config import ImportanceConfig, LossConfig
from sandrl.train.run_config import RunConfig
from sandrl.train.warm_run import warm_start_run
from sandrl.train.warm_start_config import WarmStartConfig
from sandrl.wiring.runner import local_provider


@dataclass(frozen=True)
class Row:
    """One loss to measure."""

    label: str
    loss: LossConfig
    about: str


ROWS: dict[str, Row] = {
    "dapo": Row(
        "GRPO/DAPO",
        LossConfig(loss_type="dapo"),
        "the demo's loss: GRPO's group baseline, PPO's ratio, DAPO's token aggregation, token TIS capped at 2",
    ),
    "gspo": Row(
        "GSPO",
        LossConfig(
            estimator="gspo", epsilon_low=3e-4, epsilon_high=4e-4, importance=ImportanceConfig(level="geometric")
        ),
        "GSPO as its paper and docs/guide/learning-signal.md set it: one clipped ratio per sample, each "
        "sample's token mean, importance sampling by the geometric mean, truncated at 2",
    ),
    "rloo": Row(
        "RLOO",
        LossConfig(loss_type="dapo", advantage="rloo", scale_rewards="none"),
        "the demo's loss with RLOO's leave-one-out baseline, unscaled as in its paper",
    ),
    "reinforce_pp": Row(
        "REINFORCE++",
        LossConfig(loss_type="dapo", advantage="reinforce_pp"),
        "the demo's loss with REINFORCE++'s advantages: the batch's mean and standard deviation",
    ),
    "cispo": Row(
        "CISPO",
        LossConfig(estimator="cispo", loss_type="dapo", epsilon_low=0.99, epsilon_high=0.28),
        "CISPO as docs/guide/learning-signal.md sets it: the clipped ratio as a stop-gradient weight",
    ),
    "icepop": Row(
        "DAPO + token MIS",
        LossConfig(loss_type="dapo", importance=ImportanceConfig(mode="mask", band=(0.5, 5.0))),
        "the demo's loss with IcePop's masked importance sampling: tokens whose ratio leaves [0.5, 5] leave the loss",
    ),
}
"""Every row there is, by the name ``--rows`` takes."""

DEFAULT_ROWS = ("dapo", "gspo", "rloo", "reinforce_pp")
"""The issue's rows (#41); ``cispo`` and ``icepop`` (the one that masks) on request."""

QUICK_DEMO = DemoConfig(
    train_tasks=8,
    warm_tasks=8,
    check_tasks=1,
    heldout_tasks=2,
    heldout_samples=2,
    warm=WarmStartConfig(
        steps=6,
        batch_size=4,
        tiny=TinyModelConfig(
            hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64, max_position_embeddings=384
        ),
    ),
    rl_steps=3,
    groups_per_step=2,
    rollout=dataclasses.replace(DemoConfig().rollout, group_size=2, concurrency=4, max_new_tokens=24),
)
"""The smoke run's demo (seconds): the result's shape and that every phase ran, not a gain."""


@dataclass(frozen=True)
class EstimatorSettings:
    """What the bench runs: the demo's settings, the rows and the RL seeds."""

    demo: DemoConfig = field(default_factory=DemoConfig)
    rows: tuple[str, ...] = DEFAULT_ROWS
    seeds: tuple[int, ...] = (0, 1, 2)
    quick: bool = False

    def __post_init__(self) -> None:
        unknown = [r for r in self.rows if r not in ROWS]
        if unknown or not self.rows:
            raise ConfigError(
                f"--rows takes names from {', '.join(ROWS)}, separated by commas; got {','.join(self.rows) or 'none'}"
            )
        if len(set(self.rows)) != len(self.rows):
            raise ConfigError(f"--rows names a row twice: {','.join(self.rows)}")
        if not self.seeds or any(s < 0 for s in self.seeds):
            raise ConfigError(f"the RL seeds must be at least one whole number >= 0, got {list(self.seeds)}")

    @property
    def runs(self) -> int:
        return len(self.rows) * len(self.seeds)


QUICK = EstimatorSettings(demo=QUICK_DEMO, rows=("dapo", "gspo"), seeds=(0,), quick=True)
"""``--quick``: two rows, one seed, three RL steps, two held-out tasks: well under a minute."""


def options(*, quick: bool = False, seeds: int | None = None, rows: Sequence[str] | None = None) -> EstimatorSettings:
    """The command line's settings: the defaults (or :data:`QUICK`) with what was given; checked."""
    base = QUICK if quick else EstimatorSettings()
    if seeds is not None and seeds < 1:
        raise ConfigError(f"--seeds is how many RL seeds (0, 1, ...) each row runs: at least 1, got {seeds}")
    return dataclasses.replace(
        base,
        seeds=base.seeds if seeds is None else tuple(range(seeds)),
        rows=base.rows if rows is None else tuple(rows),
    )


def shared_config(demo: DemoConfig) -> RunConfig:
    """The demo's run config with its warm start made into ``<out>/warm/warm_start``, for every row."""
    config = rl_config(demo)
    return dataclasses.replace(config, run=dataclasses.replace(config.run, output_dir=str(demo.out / "warm")))


def row_config(warmed: RunConfig, loss: LossConfig, seed: int, out: Path) -> RunConfig:
    """``warmed`` (the shared config, its model the warm start) with ``loss``, RL seed ``seed``, written to ``out``."""
    return dataclasses.replace(
        warmed,
        run=dataclasses.replace(warmed.run, output_dir=str(out), seed=seed),
        rollout=dataclasses.replace(warmed.rollout, scale_rewards=loss.scale_rewards),  # [rollout] says the same
        train=dataclasses.replace(warmed.train, loss=loss),
        warm_start=dataclasses.replace(warmed.warm_start, enabled=False),  # made once, before every row
    )


class _Mean:
    """A weighted mean built up one value at a time; None while nothing weighed."""

    def __init__(self) -> None:
        self.total = 0.0
        self.weight = 0.0

    def add(self, value: float | None, weight: float) -> None:
        if value is not None and weight > 0:
            self.total += float(value) * weight
            self.weight += weight

    def value(self, digits: int = 6) -> float | None:
        return round(self.total / self.weight, digits) if self.weight else None


_STALE_STATS = ("mismatch_kl", "is_masked_frac", "is_truncated_frac", "clip_frac")
"""The per-token means of each staleness the trainer reports (``train/stale_<n>/<stat>``)."""


def staleness_key(behind: int) -> str:
    """How :mod:`sandrl.train.diagnostics` names a staleness: ``0``, ``1``, ``2``, ``3+``."""
    return str(behind) if behind < STALE_CAP else f"{STALE_CAP}+"


def summarize(lines: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One run's numbers from its ``metrics.jsonl`` lines (see the module for the weights)."""
    whole = {k: _Mean() for k in ("mismatch_kl", "is_masked_frac", "is_truncated_frac", "entropy_mean")}
    episodes: dict[str, int] = {}
    samples: dict[str, float] = {}
    stale: dict[str, dict[str, _Mean]] = {}
    tokens, peak = 0.0, None
    for m in lines:
        trained = float(m.get("train/tokens", 0.0))
        tokens += trained
        for key, mean in whole.items():
            mean.add(m.get(f"train/{key}"), trained)
        if trained and "train/mismatch_kl" in m:
            peak = max(peak or 0.0, float(m["train/mismatch_kl"]))
        for behind, count in m.get("staleness_hist", {}).items():
            key = staleness_key(int(behind))
            episodes[key] = episodes.get(key, 0) + int(count)
        for name, value in m.items():
            parts = name.split("/")
            if len(parts) != 3 or parts[0] != "train" or not parts[1].startswith("stale_"):
                continue
            key, stat = parts[1].removeprefix("stale_"), parts[2]
            weight = float(m.get(f"train/stale_{key}/samples", 0.0))
            if stat == "samples":
                samples[key] = samples.get(key, 0.0) + weight
            elif stat in _STALE_STATS:
                stale.setdefault(key, {s: _Mean() for s in _STALE_STATS})[stat].add(value, weight)
    last = lines[-1] if lines else {}
    rewards = [float(m["reward_mean"]) for m in lines]
    by_staleness = {
        key: {
            "episodes": episodes.get(key, 0),
            "samples": int(samples.get(key, 0.0)),
            **{stat: stale[key][stat].value() if key in stale else None for stat in _STALE_STATS},
        }
        for key in sorted(episodes.keys() | samples.keys(), key=_staleness_order)
    }
    return {
        "steps": len(lines),
        "episodes": int(last.get("total_episodes", 0)),
        "samples_trained": sum(int(m.get("samples_trained", 0)) for m in lines),
        "tokens_trained": int(tokens),
        "infra_errors": int(last.get("total_infra_errors", 0)),
        "stale_dropped": int(last.get("total_stale_dropped", 0)),
        "reward_first": rewards[0] if rewards else None,
        "reward_last": rewards[-1] if rewards else None,
        **{key: mean.value() for key, mean in whole.items()},
        "mismatch_kl_max": round(peak, 6) if peak is not None else None,
        "by_staleness": by_staleness,
    }


def _staleness_order(key: str) -> int:
    return int(key.rstrip("+"))


def pool(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A row's numbers over its seeds: the gain's spread, the off-policy numbers pooled as one long run."""
    gains = [float(r["gain_points"]) for r in runs]
    after = [float(r["heldout_after"]["pass_rate"]) for r in runs]
    whole = {k: _Mean() for k in ("mismatch_kl", "is_masked_frac", "is_truncated_frac", "entropy_mean")}
    stale: dict[str, dict[str, Any]] = {}
    for r in runs:
        for key, mean in whole.items():
            mean.add(r[key], r["tokens_trained"])
        for key, cause in r["by_staleness"].items():
            into = stale.setdefault(key, {"episodes": 0, "samples": 0, **{s: _Mean() for s in _STALE_STATS}})
            into["episodes"] += cause["episodes"]
            into["samples"] += cause["samples"]
            for stat in _STALE_STATS:
                into[stat].add(cause[stat], cause["samples"])
    return {
        "gain_points": {
            "mean": round(statistics.fmean(gains), 2),
            "min": min(gains),
            "max": max(gains),
            "std": round(statistics.stdev(gains), 2) if len(gains) > 1 else None,
        },
        "heldout_after": {"mean": round(statistics.fmean(after), 4), "min": min(after), "max": max(after)},
        **{key: mean.value() for key, mean in whole.items()},
        "mismatch_kl_max": max((r["mismatch_kl_max"] for r in runs if r["mismatch_kl_max"] is not None), default=None),
        "by_staleness": {
            key: {k: v.value() if isinstance(v, _Mean) else v for k, v in cause.items()}
            for key, cause in sorted(stale.items(), key=lambda kv: _staleness_order(kv[0]))
        },
        "wall_s": round(sum(r["wall_s"] for r in runs), 1),
    }


async def run_one(
    demo: DemoConfig,
    warmed: RunConfig,
    row: str,
    seed: int,
    heldout: Sequence[Task],
    before: float,
    provider: SandboxProvider,
    console: Console,
) -> dict[str, Any]:
    """One row with one RL seed: the demo's async RL from the warm start, then the held-out pass rate."""
    out = demo.out / "runs" / f"{row}-seed{seed}"
    shutil.rmtree(out, ignore_errors=True)  # a run starts from the warm start, never from an earlier run
    started = time.monotonic()
    await run_training(row_config(warmed, ROWS[row].loss, seed, out), mode="async", provider=provider, console=console)
    rl_s = time.monotonic() - started
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    final = checkpoint.latest(out / "checkpoints")
    assert final is not None, "an RL run saves a checkpoint at its end"
    after = await heldout_pass_rate(demo, final / "model", heldout, provider, f"after-{row}-seed{seed}")
    return {
        "seed": seed,
        "gain_points": round((after["pass_rate"] - before) * 100, 2),
        "heldout_after": after,
        "rl_wall_s": round(rl_s, 1),
        "wall_s": round(time.monotonic() - started, 1),
        **summarize(lines),
    }


async def run(
    settings: EstimatorSettings | None = None, *, out: Path | None = None, console: Console | None = None
) -> dict[str, Any]:
    """Every row x every seed from one warm start under ``out`` (None: a temporary directory, removed)."""
    settings = settings or EstimatorSettings()
    con = console or Console(stderr=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sandrl-bench-estimators-") as scratch:
        tmp = Path(scratch)  # the sandboxes' state, and the runs when ``out`` is None
        demo = dataclasses.replace(settings.demo, out=out if out is not None else tmp / "out")
        provider = local_provider(tmp / "state")
        try:
            result = await _measure(settings, demo, provider, con)
        finally:
            await provider.close_all()
    result["out"] = str(out) if out is not None else None
    result["duration_s"] = round(time.monotonic() - started, 1)
    con.print(render_card(result))
    return result


async def _measure(
    settings: EstimatorSettings, demo: DemoConfig, provider: SandboxProvider, con: Console
) -> dict[str, Any]:
    rows, seeds = settings.rows, settings.seeds
    con.rule(f"[bold]bench train --estimators: {', '.join(rows)} x seeds {', '.join(map(str, seeds))}")
    warmed, warm = warm_start_run(shared_config(demo), console=con)
    assert warm is not None, "the demo's run config warm-starts"
    heldout = heldout_tasks(demo)
    before = await heldout_pass_rate(demo, warm.path, heldout, provider, "before")
    con.print(f"held-out before RL: {before['pass_rate']:.1%} ({before['passed']}/{before['episodes']} episodes)")
    runs: dict[str, list[dict[str, Any]]] = {row: [] for row in rows}
    began, done = time.monotonic(), 0
    for row in rows:
        for seed in seeds:
            left = ""
            if done:
                left = f", about {duration((time.monotonic() - began) / done * (settings.runs - done))} left"
            con.rule(f"run {done + 1}/{settings.runs}: {row} ({ROWS[row].label}), RL seed {seed}{left}")
            runs[row].append(await run_one(demo, warmed, row, seed, heldout, before["pass_rate"], provider, con))
            done += 1
    default = warmed.train.loss
    return {
        "bench": "train_estimators",
        "quick": settings.quick,
        "cpus": os.cpu_count(),
        "settings": {
            "family": demo.family,
            "mode": "async",
            "rl_steps": demo.rl_steps,
            "groups_per_step": demo.groups_per_step,
            "group_size": demo.rollout.group_size,
            "max_staleness": warmed.async_.max_staleness,
            "train_tasks": demo.train_tasks,
            "heldout_tasks": demo.heldout_tasks,
            "heldout_samples": demo.heldout_samples,
            "demo_seed": demo.seed,
            "seeds": list(seeds),
            "rows": list(rows),
            "model": dataclasses.asdict(demo.warm.tiny),
            "weights": {
                "whole_run": "each step's value weighted by its trained tokens",
                "by_staleness": "each step's per-token value of a staleness weighted by its trained samples of it",
            },
        },
        "warm_start": {
            "path": str(warm.path),
            "steps": warm.steps,
            "sampled": warm.sampled[-1][1] if warm.sampled else None,
            "wall_s": round(warm.wall_s, 1),
            "reused": warm.reused,
        },
        "heldout_before": before,
        "rows": {
            row: {
                "label": ROWS[row].label,
                "about": ROWS[row].about,
                "loss": to_table(ROWS[row].loss),  # the [train.loss] table that gives it
                "demo_default": ROWS[row].loss == default,
                **pool(runs[row]),
                "runs": runs[row],
            }
            for row in rows
        },
    }


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def render_card(result: dict[str, Any]) -> Group:
    s = result["settings"]
    gains = Table(
        title=f"train: held-out gain by estimator, '{s['family']}', {s['rl_steps']} async steps, "
        f"seeds {', '.join(map(str, s['seeds']))} ({result['cpus']} CPUs)"
    )
    for column in ("row", "gain pts", "min..max", "std", "after", "mismatch KL", "max", "masked", "truncated"):
        gains.add_column(column, justify="left" if column == "row" else "right")
    gains.add_column("wall", justify="right")
    for name, row in result["rows"].items():
        g = row["gain_points"]
        gains.add_row(
            f"{name} ({row['label']})" + (" *" if row["demo_default"] else ""),
            f"{g['mean']:+.1f}",
            f"{g['min']:+.1f}..{g['max']:+.1f}",
            _num(g["std"], ".1f"),
            f"{row['heldout_after']['mean']:.1%}",
            _num(row["mismatch_kl"], ".2e"),
            _num(row["mismatch_kl_max"], ".2e"),
            _num(row["is_masked_frac"], ".2%"),
            _num(row["is_truncated_frac"], ".2%"),
            duration(row["wall_s"]),
        )
    before = result["heldout_before"]
    gains.caption = (
        f"held-out before RL {before['pass_rate']:.1%} ({before['episodes']} episodes, one warm start); "
        "* the demo's loss; KL and shares weighted by trained tokens. A measurement, not a target."
    )
    stale = Table(title="by staleness (versions behind the update; weighted by trained samples)")
    for column in ("row", "staleness", "episodes", "trained", "mismatch KL", "masked", "truncated", "clipped"):
        stale.add_column(column, justify="left" if column == "row" else "right")
    for name, row in result["rows"].items():
        for key, cause in row["by_staleness"].items():
            stale.add_row(
                name,
                key,
                str(cause["episodes"]),
                str(cause["samples"]),
                _num(cause["mismatch_kl"], ".2e"),
                _num(cause["is_masked_frac"], ".2%"),
                _num(cause["is_truncated_frac"], ".2%"),
                _num(cause["clip_frac"], ".2%"),
            )
    return Group(gains, stale)
