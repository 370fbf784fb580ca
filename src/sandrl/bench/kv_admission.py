"""What admission by the engines' KV capacity saves: a burst of episodes on an engine whose KV cache is too
small for all of them, with the gate (``[inference] kv_admission``) and without it. ``python -m
sandrl.bench.kv_admission [--quick]`` prints a card, then one JSON line.

The same episodes run twice, each time on a fresh in-process engine of the same weights and the same KV
bound (``kv_cache_tokens``): ``episodes`` at once, each ``turns`` calls on a growing history (its own
prompt, then each reply and an observation appended), every reply ``max_new_tokens`` long. Without the
gate the engine admits what fits now and retracts running requests when decoding runs out of room; with
it, calls wait at the client for the room their whole reply needs (:mod:`sandrl.inference.kv_admission`).

Measured per side: retracted requests, the prompt tokens the prefills computed (a retraction computes a
request's context again), wall time and episodes per hour, and the calls' waits at the gate. The model
has the demo's shape, so a prefill costs what the demo's does; on a GPU engine with a long context a
retraction costs more, a wait the same.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import asdict, dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from sandrl.bench.inference_prefix import DEMO_MODEL as MODEL
from sandrl.inference.base import InferenceClient, SamplingParams
from sandrl.inference.engine import Engine, EngineConfig
from sandrl.inference.fleet import affinity
from sandrl.inference.fleet.config import AdmissionConfig
from sandrl.inference.kv_admission import admission_stats, admitted
from sandrl.inference.model import build_tiny_model


@dataclass(frozen=True)
class KVBenchConfig:
    episodes: int = 32
    turns: int = 4
    prompt_tokens: int = 150
    max_new_tokens: int = 80
    observation_tokens: int = 60
    kv_cache_tokens: int = 6000
    """About a third of what the burst holds at its last turn (32 x 650 tokens)."""
    interval_s: float = 0.05
    seed: int = 0


QUICK = KVBenchConfig(
    episodes=8, turns=2, prompt_tokens=60, max_new_tokens=24, observation_tokens=20, kv_cache_tokens=400
)


async def _episodes(policy: InferenceClient, config: KVBenchConfig) -> list[float]:
    params = SamplingParams(max_new_tokens=config.max_new_tokens, ignore_eos=True, temperature=1.0)

    async def one(index: int) -> float:
        rng = random.Random(config.seed * 1000 + index)
        ids = [rng.randrange(1, 250) for _ in range(config.prompt_tokens)]
        with affinity.bound(f"bench/kv#0/{index}") as route:
            for _ in range(config.turns):
                generation = await policy.generate(ids, params)
                observation = [rng.randrange(1, 250) for _ in range(config.observation_tokens)]
                ids = [*ids, *generation.output_ids, *observation]
        return route.kv_wait_s

    return list(await asyncio.gather(*(one(i) for i in range(config.episodes))))


async def _side(config: KVBenchConfig, gated: bool) -> dict[str, Any]:
    net, tokenizer = build_tiny_model(MODEL)  # the same weights on both sides (the shape's seed)
    engine = Engine(net, tokenizer, config=EngineConfig(seed=config.seed, kv_cache_tokens=config.kv_cache_tokens))
    try:
        policy: InferenceClient = engine
        if gated:
            policy = admitted(engine, AdmissionConfig(interval_s=config.interval_s), where="the benchmark's engine")
        start = time.monotonic()
        waits = await _episodes(policy, config)
        wall = time.monotonic() - start
        gate = admission_stats(policy) or {}
        return {
            "gated": gated,
            "wall_s": round(wall, 3),
            "episodes_per_hour": round(config.episodes / wall * 3600),
            "kv_retractions": engine.stats.kv_retractions,
            "prefill_tokens": engine.stats.prefill_tokens,
            "prefill_tokens_per_episode": round(engine.stats.prefill_tokens / config.episodes, 1),
            "max_batch": engine.stats.max_batch,
            "kv_wait_s_mean": round(sum(waits) / len(waits), 4),
            "kv_wait_s_max": round(max(waits), 4),
            "calls_waited": gate.get("waited", 0),
            "readings": gate.get("readings", 0),
        }
    finally:
        engine.close()


def run(config: KVBenchConfig, console: Console | None = None) -> dict[str, Any]:
    """Both sides, the card printed; the JSON line's dict."""
    without = asyncio.run(_side(config, gated=False))
    with_gate = asyncio.run(_side(config, gated=True))
    result = {"bench": "kv_admission", "config": asdict(config), "without": without, "with": with_gate}
    table = Table(title=f"KV admission: {config.episodes} episodes x {config.turns} turns, KV {config.kv_cache_tokens}")
    table.add_column("")
    table.add_column("without the gate", justify="right")
    table.add_column("with the gate", justify="right")
    for key in ("kv_retractions", "prefill_tokens_per_episode", "wall_s", "episodes_per_hour", "kv_wait_s_mean"):
        table.add_row(key, str(without[key]), str(with_gate[key]))
    (console or Console()).print(table)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="seconds: 8 episodes x 2 turns")
    args = parser.parse_args()
    print(json.dumps(run(QUICK if args.quick else KVBenchConfig())))


if __name__ == "__main__":
    main()
