"""``sandrl bench inference --update-policy``: what each weight-update policy costs async training.

An emulation of the async driver's inference side, on the embedded engine: ``concurrency``
episode slots generate without pause (one generation an episode, the next starting as soon as
one ends), with a long tail of lengths (lognormal, ``ignore_eos`` so each runs to its drawn
length), while a trainer stand-in loads a saved checkpoint every ``update_every_s`` seconds
(two checkpoints, alternately, each a real weight swap). Every policy runs for the same time on
the same sequences of episodes, in ``rounds`` short runs each whose order rotates (so a neighbour's
load on a shared machine falls on every policy alike), in one process:

- ``in_place``: the swap lands between two decode steps; episodes in flight go on.
- ``pause``: no new episode starts until the ones in flight finish on the old weights.
- ``abort_and_resume``: episodes in flight are retracted and resumed from their tokens.
- reference ``abort`` (not a policy; what SGLang's ``abort_all_requests`` does and what users of
  the reference system report): episodes in flight end, their tokens are thrown away, and they
  are generated again from the start.

Reported per policy: episodes per hour (episodes that reached their length within the window),
tokens per second, tokens discarded per update (generated, then thrown away by the update),
update latency (from the request to the swap: ``pause`` waits for the longest episode in flight),
the lengths of the finished episodes, and their staleness per token (how many versions behind the
engine's version each token was when its episode finished; :mod:`sandrl.train.staleness`), with
the tokens of episodes whose oldest token is more than ``max_staleness`` versions old (the async
driver would drop or regenerate those). Target (issue 22): ``pause`` and ``abort_and_resume``
discard 0 tokens and keep at least 0.95x ``in_place``'s episodes per hour.

On a machine shared with other work the absolute numbers move with the neighbours; the rounds
interleave the policies so that the ratios compare them on the same load.
"""

from __future__ import annotations

import asyncio
import collections
import math
import os
import random
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, cast

from sandrl.errors import ConfigError
from sandrl.inference.base import UPDATE_POLICIES, Generation, SamplingParams, UpdatePolicy
from sandrl.inference.engine import Engine, EngineConfig
from sandrl.inference.model import build_tiny_model, save_weights
from sandrl.inference.tiny_config import TinyModelConfig
from sandrl.inference.tokenizer import TINY
from sandrl.stats import quantile

REFERENCE: Final = "abort"
"""The reference row: in-flight generations thrown away on every update (SGLang's ``abort_all_requests``)."""
TARGET_RATIO = 0.95

Mode = Literal["in_place", "pause", "abort_and_resume", "abort"]


@dataclass(frozen=True)
class UpdateBenchConfig:
    """The run's shape; :meth:`quick` is the seconds-long smoke run."""

    policies: tuple[str, ...] = UPDATE_POLICIES
    """Policies to compare (each runs ``duration_s``)."""
    reference_abort: bool = True
    """Also run the ``abort`` reference row."""
    duration_s: float = 40.0
    """Seconds per policy, over all rounds."""
    rounds: int = 4
    """Short runs per policy, interleaved with the other policies' in rotating order."""
    update_every_s: float = 4.0
    concurrency: int = 16
    """Episodes generating at once (the async driver's groups in flight, flattened)."""
    prompt_tokens: int = 32
    median_tokens: int = 48
    """Median episode length; lengths are lognormal around it (``sigma``), clipped to [min, max]."""
    sigma: float = 1.0
    min_tokens: int = 4
    max_tokens: int = 512
    max_staleness: int = 1
    """The async driver's bound, for the ``tokens_over_staleness_per_update`` column."""
    seed: int = 0

    def __post_init__(self) -> None:
        unknown = [p for p in self.policies if p not in UPDATE_POLICIES]
        if unknown or not self.policies:
            raise ConfigError(f"policies are {', '.join(UPDATE_POLICIES)} (or all), got {list(self.policies)}")
        if not (self.duration_s > 0 and self.update_every_s > 0 and math.isfinite(self.duration_s)):
            raise ConfigError("duration_s and update_every_s must be positive numbers of seconds")
        if min(self.concurrency, self.prompt_tokens, self.min_tokens, self.rounds) < 1 or self.max_staleness < 0:
            raise ConfigError("concurrency, prompt_tokens, min_tokens and rounds must be >= 1, max_staleness >= 0")
        if not self.min_tokens <= self.median_tokens <= self.max_tokens or self.sigma < 0:
            raise ConfigError("lengths need min_tokens <= median_tokens <= max_tokens and sigma >= 0")

    @classmethod
    def quick(cls, **overrides: Any) -> UpdateBenchConfig:
        """Seconds in all: the result's shape, not its ratios."""
        base: dict[str, Any] = dict(
            duration_s=2.0, rounds=1, update_every_s=0.5, concurrency=4, median_tokens=8, max_tokens=48, prompt_tokens=8
        )
        return cls(**{**base, **overrides})


@dataclass
class _Run:
    """What one policy's run collected."""

    finished: list[tuple[float, Generation, int]] = field(default_factory=list)
    """(time, generation, engine version at that time) of every episode that reached its length."""
    discarded_tokens: int = 0
    aborted: int = 0
    update_latencies_s: list[float] = field(default_factory=list)
    decode_steps: int = 0
    per_round: list[int] = field(default_factory=list)
    """Episodes finished in each round's window: the rounds pair the policies (same lengths, same order)."""


def draw_length(rng: random.Random, config: UpdateBenchConfig) -> int:
    """One episode's length: lognormal around the median, clipped."""
    raw = config.median_tokens * math.exp(rng.gauss(0.0, config.sigma))
    return max(config.min_tokens, min(config.max_tokens, round(raw)))


async def run_policy(
    mode: Mode, config: UpdateBenchConfig, checkpoints: tuple[Path, Path], run: _Run, round_index: int = 0
) -> None:
    """One round of one policy, ``duration_s / rounds`` seconds on a fresh engine; adds to ``run``."""
    engine_policy: UpdatePolicy = "in_place" if mode == "abort" else mode
    engine = Engine.load(TINY, EngineConfig(seed=config.seed, update_policy=engine_policy, max_batch_size=64))
    seconds = config.duration_s / config.rounds
    stop = asyncio.Event()
    finished_before = len(run.finished)
    try:
        await engine.generate([1, 2, 3], SamplingParams(max_new_tokens=4))  # warm-up
        start = time.monotonic()
        slots = [
            asyncio.ensure_future(_slot(i, round_index, engine, config, run, stop)) for i in range(config.concurrency)
        ]
        updater = asyncio.ensure_future(_updater(mode, engine, config, checkpoints, run, start))
        await asyncio.sleep(seconds)
        stop.set()
        updater.cancel()
        engine.abort()  # the episodes still running are past the window: not counted either way
        await asyncio.gather(updater, *slots, return_exceptions=True)
        run.decode_steps += engine.stats.steps
    finally:
        await engine.aclose()
    run.finished[finished_before:] = [f for f in run.finished[finished_before:] if f[0] - start <= seconds]
    run.per_round.append(len(run.finished) - finished_before)


async def _slot(
    index: int, round_index: int, engine: Engine, config: UpdateBenchConfig, run: _Run, stop: asyncio.Event
) -> None:
    rng = random.Random(f"sandrl.bench.inference_updates:{config.seed}:{round_index}:{index}")
    while not stop.is_set():
        length = draw_length(rng, config)
        prompt = [rng.randrange(256) for _ in range(config.prompt_tokens)]
        params = SamplingParams(max_new_tokens=length, ignore_eos=True, seed=rng.getrandbits(31))
        while not stop.is_set():
            g = await engine.generate(prompt, params)
            if g.finish_reason == "length":
                run.finished.append((time.monotonic(), g, engine.weight_version))
                break
            if not stop.is_set():  # thrown away by an update: the episode starts over
                run.discarded_tokens += len(g.output_ids)
                run.aborted += 1


async def _updater(
    mode: Mode, engine: Engine, config: UpdateBenchConfig, checkpoints: tuple[Path, Path], run: _Run, start: float
) -> None:
    """A weight update every ``update_every_s`` (on schedule; one that ran late is followed at once)."""
    k = 1
    while True:
        await asyncio.sleep(max(0.0, start + k * config.update_every_s - time.monotonic()))
        began = time.monotonic()
        if mode == REFERENCE:
            engine.abort()
        await engine.update_weights(str(checkpoints[k % 2]))
        run.update_latencies_s.append(time.monotonic() - began)
        k += 1


def _row(config: UpdateBenchConfig, run: _Run) -> dict[str, Any]:
    window = run.finished
    lengths = sorted(len(g.output_ids) for _, g, _ in window)
    tokens = sum(lengths)
    updates = len(run.update_latencies_s)
    per_token: collections.Counter[int] = collections.Counter()
    over = mixed = 0
    for _, g, version in window:
        versions = g.token_weight_versions()
        known = [v for v in versions if v is not None]
        per_token.update(version - v for v in known)
        mixed += len(set(known)) > 1
        if known and version - min(known) > config.max_staleness:
            over += len(versions)
    latencies = run.update_latencies_s
    return {
        "episodes": len(window),
        "episodes_per_hour": round(len(window) / config.duration_s * 3600, 1),
        "tokens_per_s": round(tokens / config.duration_s, 1),
        "updates": updates,
        "update_latency_p50_s": round(quantile(latencies, 0.5), 4) if latencies else None,
        "update_latency_max_s": round(max(latencies), 4) if latencies else None,
        "aborted_generations": run.aborted,
        "tokens_discarded": run.discarded_tokens,
        "tokens_discarded_per_update": round(run.discarded_tokens / updates, 1) if updates else 0.0,
        "tokens_over_staleness_per_update": round(over / updates, 1) if updates else 0.0,
        "mixed_version_episodes": mixed,
        "token_staleness_hist": {str(k): n for k, n in sorted(per_token.items())},
        "length_p50": round(quantile(lengths, 0.5), 1) if lengths else None,
        "length_p90": round(quantile(lengths, 0.9), 1) if lengths else None,
        "length_p99": round(quantile(lengths, 0.99), 1) if lengths else None,
        "length_max": lengths[-1] if lengths else None,
        "length_mean": round(tokens / len(lengths), 1) if lengths else None,
        "decode_steps_per_s": round(run.decode_steps / config.duration_s, 1),
    }


def run(config: UpdateBenchConfig, *, progress: Any = None) -> dict[str, Any]:
    """Every policy (then the reference) in turn; one flat-enough dict, the JSON line."""
    modes: list[Mode] = [cast(Mode, p) for p in UPDATE_POLICIES if p in config.policies]
    if config.reference_abort:
        modes.append("abort")
    with tempfile.TemporaryDirectory(prefix="sandrl-bench-updates-") as tmp:
        checkpoints = tuple(_checkpoint(seed, Path(tmp) / f"weights-{seed}") for seed in (1, 2))
        runs = {mode: _Run() for mode in modes}
        for r in range(config.rounds):
            for mode in modes[r % len(modes) :] + modes[: r % len(modes)]:
                if progress is not None:
                    progress(
                        f"round {r + 1}/{config.rounds} {mode}: {config.duration_s / config.rounds:g} s, "
                        f"an update every {config.update_every_s:g} s"
                    )
                asyncio.run(run_policy(mode, config, (checkpoints[0], checkpoints[1]), runs[mode], r))
    rows = {mode: _row(config, run) for mode, run in runs.items()}
    base = rows.get("in_place", {}).get("episodes_per_hour")
    base_rounds = runs["in_place"].per_round if "in_place" in runs else []
    for mode, row in rows.items():
        row["episodes_per_hour_vs_in_place"] = round(row["episodes_per_hour"] / base, 3) if base else None
        # Each round is a pair (same episode lengths in the same order): the spread of the pairs'
        # ratios says how far the run's noise moves the total's ratio.
        row["vs_in_place_by_round"] = (
            [round(n / b, 3) if b else None for n, b in zip(runs[mode].per_round, base_rounds, strict=True)]
            if base_rounds
            else []
        )
    checked = [p for p in ("pause", "abort_and_resume") if p in rows]
    target = (
        all(
            rows[p]["tokens_discarded"] == 0 and (rows[p]["episodes_per_hour_vs_in_place"] or 0) >= TARGET_RATIO
            for p in checked
        )
        if base and checked
        else None
    )
    return {
        "bench": "inference_updates",
        "model": TINY,
        "config": asdict(config),
        "policies": {mode: rows[mode] for mode in rows if mode != REFERENCE},
        "reference_abort": rows.get(REFERENCE),
        "target": f"pause and abort_and_resume discard 0 tokens and keep >= {TARGET_RATIO}x in_place's episodes/hour",
        "target_met": target,
        "cpus": os.cpu_count(),
    }


def _checkpoint(seed: int, path: Path) -> Path:
    model, tokenizer = build_tiny_model(TinyModelConfig(seed=seed))
    return save_weights(model, path, tokenizer)


def render_card(result: dict[str, Any]) -> str:
    """The human-readable card printed before the JSON line."""
    c = result["config"]
    lines = [
        f"weight-update policies under async generation: {c['concurrency']} episodes at once, lengths lognormal "
        f"(median {c['median_tokens']}, sigma {c['sigma']}, {c['min_tokens']}-{c['max_tokens']} tokens), "
        f"an update every {c['update_every_s']:g} s, {c['duration_s']:g} s per policy in {c['rounds']} rounds, "
        f"{result['cpus']} CPUs",
        f"  {'policy':<18}{'episodes/h':>11}{'vs in_place':>12}{'tok/s':>8}{'discarded/upd':>14}"
        f"{'update p50 s':>13}{'len p50/p99/max':>19}{'over bound/upd':>15}",
    ]
    rows = dict(result["policies"])
    if result.get("reference_abort"):
        rows["abort (reference)"] = result["reference_abort"]
    for name, r in rows.items():
        ratio = r["episodes_per_hour_vs_in_place"]
        p50 = r["update_latency_p50_s"]
        spread = f"{r['length_p50']}/{r['length_p99']}/{r['length_max']}"
        lines.append(
            f"  {name:<18}{r['episodes_per_hour']:>11.0f}{(f'{ratio:.3f}x' if ratio is not None else '-'):>12}"
            f"{r['tokens_per_s']:>8.0f}{r['tokens_discarded_per_update']:>14.1f}"
            f"{(f'{p50:.3f}' if p50 is not None else '-'):>13}"
            f"{spread:>19}"
            f"{r['tokens_over_staleness_per_update']:>15.1f}"
        )
        rounds = [x for x in r.get("vs_in_place_by_round", []) if x is not None]
        if rounds and name != "in_place":
            lines.append(f"  {'':<18}by round: {', '.join(f'{x:.3f}x' for x in rounds)}")
    met = result["target_met"]
    lines.append(f"  target: {result['target']}: {'met' if met else 'not met' if met is not None else 'not checked'}")
    lines.append("  (a shared machine moves the absolute numbers; the rounds interleave the policies on the same load)")
    return "\n".join(lines)
