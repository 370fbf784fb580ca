"""The embedded engine's KV bound (``kv_cache_tokens``): admission by what fits, retraction when decoding
runs out, nothing lost, and the reading it reports."""

from __future__ import annotations

import asyncio

import pytest

from sandrl.errors import ConfigError
from sandrl.inference.base import SamplingParams
from sandrl.inference.engine import Engine, EngineConfig

BURST = SamplingParams(max_new_tokens=24, ignore_eos=True, seed=7)


def prompts(n: int, length: int = 40) -> list[list[int]]:
    return [[(i * 7 + j) % 200 + 1 for j in range(length)] for i in range(n)]


async def test_a_burst_past_the_bound_is_retracted_and_loses_no_token() -> None:
    bounded = Engine.load("tiny", EngineConfig(seed=0, kv_cache_tokens=400))
    free = Engine.load("tiny", EngineConfig(seed=0))
    try:
        capped = await asyncio.gather(*(bounded.generate(p, BURST) for p in prompts(12)))
        plain = await asyncio.gather(*(free.generate(p, BURST) for p in prompts(12)))
        # Each request fits alone (40 + 24 < 400) but twelve do not: decoding ran out and retracted.
        assert bounded.stats.kv_retractions > 0 and free.stats.kv_retractions == 0
        # A retracted request resumes from its tokens: the same outputs as on an engine without a bound.
        assert [g.output_ids for g in capped] == [g.output_ids for g in plain]
        assert all(len(g.output_ids) == 24 for g in capped)
        assert bounded.stats.prefill_tokens > free.stats.prefill_tokens  # what the retractions cost
        idle = await bounded.kv_capacity()
        assert (idle.running, idle.queued, idle.used_tokens, idle.total_tokens) == (0, 0, 0, 400)
        assert idle.max_running == 64
    finally:
        bounded.close()
        free.close()


async def test_a_request_is_capped_to_the_bound_and_a_prompt_that_fills_it_is_refused() -> None:
    engine = Engine.load("tiny", EngineConfig(seed=0, kv_cache_tokens=100))
    try:
        long = await engine.generate(list(range(1, 61)), SamplingParams(max_new_tokens=500, ignore_eos=True))
        assert len(long.output_ids) == 40 and long.finish_reason == "length"  # 60 + 40 = the bound
        with pytest.raises(ConfigError, match=r"KV cache holds 100.*kv-cache-tokens"):
            await engine.generate(list(range(1, 101)), SamplingParams(max_new_tokens=4))
        assert engine.stats.kv_retractions == 0
    finally:
        engine.close()


async def test_the_reading_counts_running_and_queued_requests_and_their_tokens() -> None:
    engine = Engine.load("tiny", EngineConfig(seed=0, kv_cache_tokens=300, max_batch_size=2))
    try:
        slow = SamplingParams(max_new_tokens=200, ignore_eos=True)
        calls = [asyncio.ensure_future(engine.generate(p, slow)) for p in prompts(3, 20)]
        for _ in range(400):
            reading = await engine.kv_capacity()
            if reading.running == 2 and reading.queued == 1:
                break
            await asyncio.sleep(0.005)
        assert (reading.running, reading.queued, reading.max_running) == (2, 1, 2)
        assert reading.used_tokens is not None and 40 < reading.used_tokens <= 300
        assert reading.free_tokens == 300 - reading.used_tokens
        engine.abort()
        await asyncio.gather(*calls)
    finally:
        engine.close()


def test_a_negative_bound_is_refused() -> None:
    with pytest.raises(ConfigError, match="kv_cache_tokens must be >= 0"):
        EngineConfig(kv_cache_tokens=-1)
