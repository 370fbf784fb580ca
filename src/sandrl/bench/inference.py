"""``sandrl bench inference``: the embedded engine's throughput alone and under concurrency.

The same requests run twice on one engine: one at a time, then ``concurrency`` at once.
Continuous batching decodes concurrent requests in one forward per step, so the second
run's tokens per second over the first's is what batching buys on this machine.
Every request generates exactly ``max_new_tokens`` (``ignore_eos``), so both runs do the
same work.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from typing import Any

from sandrl.errors import ConfigError
from sandrl.inference.base import SamplingParams
from sandrl.inference.engine import Engine, EngineConfig
from sandrl.inference.tokenizer import TINY


def bench_engine(
    model: str = TINY,
    *,
    concurrency: int = 16,
    requests: int | None = None,
    prompt_tokens: int = 32,
    max_new_tokens: int = 64,
    config: EngineConfig | None = None,
    seed: int = 0,
    repeats: int = 3,
) -> dict[str, Any]:
    """Run the benchmark; returns one flat dict (the JSON line of ``sandrl bench inference``).

    Each mode runs ``repeats`` times and its fastest run counts: on a shared machine the
    slower runs measure the neighbours, not the engine.
    """
    n = requests if requests is not None else concurrency
    if min(concurrency, n, prompt_tokens, max_new_tokens, repeats) < 1:
        raise ConfigError("bench_engine: concurrency, requests, prompt_tokens, max_new_tokens and repeats must be >= 1")
    rng = random.Random(seed)
    engine = Engine.load(model, config)
    try:
        vocab = engine.tokenizer.vocab_size if engine.tokenizer is not None else engine.vocab_size
        # Byte-range ids are valid for any tokenizer of at least 256 tokens; random ones otherwise.
        prompts = [[rng.randrange(min(vocab, 256)) for _ in range(prompt_tokens)] for _ in range(n)]
        params = [
            SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True, seed=seed + i, temperature=1.0)
            for i in range(n)
        ]
        asyncio.run(_run(engine, prompts[: min(n, concurrency)], params, concurrency))  # warm-up
        sequential_s = min(asyncio.run(_run(engine, prompts, params, 1)) for _ in range(repeats))
        steps_before, tokens_before = engine.stats.steps, engine.stats.decoded_tokens
        concurrent_s = min(asyncio.run(_run(engine, prompts, params, concurrency)) for _ in range(repeats))
        steps = engine.stats.steps - steps_before
        mean_batch = (engine.stats.decoded_tokens - tokens_before) / steps if steps else 0.0
        threads = engine.num_threads
    finally:
        engine.close()
    tokens = n * max_new_tokens
    return {
        "bench": "inference",
        "model": model,
        "concurrency": concurrency,
        "requests": n,
        "prompt_tokens": prompt_tokens,
        "max_new_tokens": max_new_tokens,
        "sequential_s": round(sequential_s, 4),
        "concurrent_s": round(concurrent_s, 4),
        "sequential_tokens_per_s": round(tokens / sequential_s, 1),
        "concurrent_tokens_per_s": round(tokens / concurrent_s, 1),
        "speedup": round(sequential_s / concurrent_s, 2),
        "mean_batch": round(mean_batch, 2),
        "repeats": repeats,
        "torch_threads": threads,
        "cpus": os.cpu_count(),
    }


def render_card(result: dict[str, Any]) -> str:
    """The human-readable card printed before the JSON line."""
    return "\n".join(
        [
            f"inference engine: {result['model']}, {result['requests']} requests x {result['max_new_tokens']} tokens "
            f"(prompts of {result['prompt_tokens']}), {result['cpus']} CPUs, {result['torch_threads']} torch threads",
            f"  one at a time      {result['sequential_tokens_per_s']:>10.1f} tokens/s",
            f"  {result['concurrency']:>3} concurrent     {result['concurrent_tokens_per_s']:>10.1f} tokens/s"
            f"   (mean batch {result['mean_batch']})",
            f"  speedup            {result['speedup']:>10.2f}x",
        ]
    )


async def _run(engine: Engine, prompts: list[list[int]], params: list[SamplingParams], concurrency: int) -> float:
    gate = asyncio.Semaphore(concurrency)

    async def one(prompt: list[int], p: SamplingParams) -> None:
        async with gate:
            await engine.generate(prompt, p)

    started = time.perf_counter()
    await asyncio.gather(*(one(prompt, p) for prompt, p in zip(prompts, params, strict=True)))
    return time.perf_counter() - started
