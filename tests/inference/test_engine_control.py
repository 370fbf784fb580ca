"""The engine under control: weight-update policies with 8 generations in flight, exact per-token
versions, abort, pause / continue, streaming and logit_bias.

Log-probs are checked against a teacher-forced forward pass of the weights each token claims
to come from (tolerance 1e-4, as in test_engine.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sandrl.errors import ConfigError
from sandrl.inference.base import Generation, SamplingParams
from sandrl.inference.batch import Partial
from sandrl.inference.engine import Engine, EngineConfig
from sandrl.inference.model import build_tiny_model
from sandrl.inference.tiny_config import TinyModelConfig
from sandrl.inference.tokenizer import ByteTokenizer

from .decoding import all_decoding

ForwardLogprobs = Callable[[Any, list[int], list[int]], list[float]]
TOLERANCE = 1e-4
IN_FLIGHT = 8
LONG = 300


@pytest.fixture(scope="module")
def models() -> tuple[Any, Any]:
    """The engine's initial weights (version 0) and those of ``other_checkpoint`` (version 1)."""
    return build_tiny_model(TinyModelConfig())[0], build_tiny_model(TinyModelConfig(seed=1))[0]


def _prompts(tok: ByteTokenizer) -> list[list[int]]:
    return [tok.encode_messages([{"role": "user", "content": f"task {i}" * (i + 1)}]) for i in range(IN_FLIGHT)]


async def _in_flight(eng: Engine, prompts: list[list[int]], tokens: int = LONG) -> list[asyncio.Future[Generation]]:
    """Start one long generation per prompt and return once all of them are decoding."""
    params = SamplingParams(max_new_tokens=tokens, ignore_eos=True, seed=5, temperature=0.8)
    steps = eng.stats.steps
    flights = [asyncio.ensure_future(eng.generate(p, params, rid=f"r{i}")) for i, p in enumerate(prompts)]
    for _ in range(4000):
        if all_decoding(eng, len(prompts), steps):
            break
        await asyncio.sleep(0.005)
    assert not any(f.done() for f in flights), "the update must land while requests are decoding"
    return flights


def _max_gap(a: list[float], b: list[float]) -> float:
    return max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0)


async def test_in_place_records_the_version_of_every_token(
    tokenizer: ByteTokenizer, other_checkpoint: Path, models: tuple[Any, Any], forward_logprobs: ForwardLogprobs
) -> None:
    async with Engine.load("tiny", EngineConfig(update_policy="in_place")) as eng:
        prompts = _prompts(tokenizer)
        flights = await _in_flight(eng, prompts)
        assert await eng.update_weights(str(other_checkpoint)) == 1
        results = await asyncio.gather(*flights)
    for prompt, g in zip(prompts, results, strict=True):
        versions = g.output_weight_versions
        assert versions is not None and len(versions) == LONG
        switch = versions.index(1)
        # Tokens before the swap say 0, every token after it says 1; the turn is not attributed to one version.
        assert 0 < switch < LONG and versions == [0] * switch + [1] * (LONG - switch)
        assert (g.start_weight_version, g.weight_version) == (0, 1)
        assert g.token_weight_versions() == versions
        # The tokens that claim version 0 are exactly what the old weights give.
        before = forward_logprobs(models[0], prompt, g.output_ids[:switch])
        assert _max_gap(g.output_logprobs[:switch], before) < TOLERANCE


async def test_pause_lets_running_requests_finish_on_old_weights_and_new_ones_start_on_new(
    tokenizer: ByteTokenizer, other_checkpoint: Path, models: tuple[Any, Any], forward_logprobs: ForwardLogprobs
) -> None:
    async with Engine.load("tiny", EngineConfig(update_policy="pause")) as eng:
        prompts = _prompts(tokenizer)
        flights = await _in_flight(eng, prompts, tokens=120)
        update = asyncio.ensure_future(eng.update_weights(str(other_checkpoint)))
        while not eng._updates and not update.done():  # the checkpoint is read; the swap waits for the running
            await asyncio.sleep(0.005)
        late = asyncio.ensure_future(eng.generate(prompts[0], SamplingParams(max_new_tokens=20, seed=1)))
        results = await asyncio.gather(*flights)
        assert await update == 1
        after = await late
    for prompt, g in zip(prompts, results, strict=True):
        assert g.finish_reason == "length" and g.output_weight_versions == [0] * 120
        assert _max_gap(g.output_logprobs, forward_logprobs(models[0], prompt, g.output_ids)) < TOLERANCE
    # The request that arrived during the update waited for it and ran on the new weights only.
    assert after.output_weight_versions == [1] * len(after.output_ids) and after.start_weight_version == 1
    assert _max_gap(after.output_logprobs, forward_logprobs(models[1], prompts[0], after.output_ids)) < TOLERANCE


async def test_abort_and_resume_completes_every_generation_as_a_continuation(
    tokenizer: ByteTokenizer, other_checkpoint: Path, models: tuple[Any, Any], forward_logprobs: ForwardLogprobs
) -> None:
    async with Engine.load("tiny", EngineConfig(update_policy="abort_and_resume")) as eng:
        prompts = _prompts(tokenizer)
        flights = await _in_flight(eng, prompts)
        assert await eng.update_weights(str(other_checkpoint)) == 1
        results = await asyncio.gather(*flights)
    for prompt, g in zip(prompts, results, strict=True):
        # Nothing is lost: every generation runs to its budget.
        assert g.finish_reason == "length" and len(g.output_ids) == LONG
        versions = g.output_weight_versions
        assert versions is not None
        switch = versions.index(1)
        assert 0 < switch < LONG and versions == [0] * switch + [1] * (LONG - switch)
        # Before the swap: the old weights. After it: the new weights over a KV cache rebuilt from
        # prompt + the old tokens, so a teacher-forced pass of the new weights over the whole
        # sequence reproduces them (no stale cache, unlike in_place).
        old = forward_logprobs(models[0], prompt, g.output_ids[:switch])
        new = forward_logprobs(models[1], prompt, g.output_ids)[switch:]
        assert _max_gap(g.output_logprobs[:switch], old) < TOLERANCE
        assert _max_gap(g.output_logprobs[switch:], new) < TOLERANCE


async def test_an_update_can_choose_its_own_policy(tokenizer: ByteTokenizer, other_checkpoint: Path) -> None:
    async with Engine.load("tiny") as eng:
        flights = await _in_flight(eng, _prompts(tokenizer)[:2], tokens=120)
        assert await eng.update_weights(str(other_checkpoint), policy="pause") == 1
        assert all(g.output_weight_versions == [0] * 120 for g in await asyncio.gather(*flights))
        with pytest.raises(ConfigError, match="unknown weight-update policy 'later'"):
            await eng.update_weights(str(other_checkpoint), policy="later")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="update_policy must be one of"):
        EngineConfig(update_policy="never")  # type: ignore[arg-type]


async def test_abort_one_request_or_all(tokenizer: ByteTokenizer) -> None:
    async with Engine.load("tiny") as eng:
        flights = await _in_flight(eng, _prompts(tokenizer)[:3])
        assert eng.abort("r1") == 1 and eng.abort("nobody") == 0
        aborted = await flights[1]
        assert aborted.finish_reason == "abort" and 0 < len(aborted.output_ids) < LONG
        assert len(aborted.output_weight_versions or []) == len(aborted.output_ids)
        assert eng.abort() == 2
        assert all(g.finish_reason == "abort" for g in await asyncio.gather(flights[0], flights[2]))
        assert eng.running == 0


async def test_pause_modes_and_continue(tokenizer: ByteTokenizer) -> None:
    prompts = _prompts(tokenizer)[:2]
    async with Engine.load("tiny") as eng:
        # in_place: the requests stop where they are and resume with their cache.
        flights = await _in_flight(eng, prompts, tokens=80)
        await eng.pause("in_place")
        steps = eng.stats.steps
        queued = asyncio.ensure_future(eng.generate(prompts[0], SamplingParams(max_new_tokens=4)))
        await asyncio.sleep(0.1)
        assert eng.paused and eng.stats.steps == steps and not queued.done()
        await eng.continue_generation()
        assert all(len(g.output_ids) == 80 for g in await asyncio.gather(*flights))
        assert (await queued).finish_reason in ("stop", "length")
        # retract: the requests drop their cache and are prefilled again with their tokens on continue.
        flights = await _in_flight(eng, prompts, tokens=80)
        prefills = eng.stats.prefills
        await eng.pause("retract")
        await eng.continue_generation()
        results = await asyncio.gather(*flights)
        assert all(g.finish_reason == "length" and len(g.output_ids) == 80 for g in results)
        assert eng.stats.prefills > prefills
        # abort: the requests in flight end now.
        flights = await _in_flight(eng, prompts, tokens=80)
        await eng.pause("abort")
        assert all(g.finish_reason == "abort" for g in await asyncio.gather(*flights))
        await eng.continue_generation()
        assert not eng.paused
        with pytest.raises(ConfigError, match="unknown pause mode"):
            await eng.pause("nap")  # type: ignore[arg-type]


async def test_set_weight_version_applies_to_later_tokens(tokenizer: ByteTokenizer) -> None:
    async with Engine.load("tiny") as eng:
        await eng.set_weight_version(42)
        g = await eng.generate(_prompts(tokenizer)[0], SamplingParams(max_new_tokens=3, ignore_eos=True))
        assert eng.weight_version == 42 and g.output_weight_versions == [42, 42, 42]


async def test_stream_yields_the_output_so_far_then_the_generation(engine: Engine, tokenizer: ByteTokenizer) -> None:
    prompt = _prompts(tokenizer)[0]
    params = SamplingParams(max_new_tokens=6, seed=3, ignore_eos=True)
    chunks = [c async for c in engine.stream(prompt, params)]
    final = chunks[-1]
    assert isinstance(final, Generation) and all(isinstance(c, Partial) for c in chunks[:-1])
    partial = [c for c in chunks if isinstance(c, Partial)]
    # One Partial per token, unless this reader fell behind the engine (then they coalesce to the latest).
    lengths = [len(c.output_ids) for c in partial] + [len(final.output_ids)]
    assert lengths == sorted(set(lengths)) and lengths[0] >= 1 and lengths[-1] == 6
    assert all(final.output_ids[: len(c.output_ids)] == c.output_ids for c in partial)
    assert final.output_ids == (await engine.generate(prompt, params)).output_ids


async def test_logit_bias_shifts_the_distribution(engine: Engine, tokenizer: ByteTokenizer) -> None:
    prompt = _prompts(tokenizer)[0]
    forced = ord("Q")
    g = await engine.generate(prompt, SamplingParams(max_new_tokens=4, temperature=0, logit_bias=((forced, 100.0),)))
    assert g.output_ids == [forced] * 4 and all(lp > -1e-3 for lp in g.output_logprobs)
    with pytest.raises(ConfigError, match="logit_bias"):
        SamplingParams(logit_bias=((-1, 1.0),))


async def test_a_prefill_pads_a_short_prompt_to_a_long_one_only_within_the_bound(tokenizer: ByteTokenizer) -> None:
    """Prompts queued together are prefilled together unless padding them to the longest would
    cost more than MAX_PADDING x their real tokens; each result is the same either way."""
    params = SamplingParams(max_new_tokens=3, ignore_eos=True, seed=1)
    long_prompt = tokenizer.encode_messages([{"role": "user", "content": "x" * 400}])
    short = [tokenizer.encode_messages([{"role": "user", "content": f"t{i}"}]) for i in range(3)]
    # Without the prefix cache: with it, the repeated prompts would prefill one token each.
    async with Engine.load("tiny", EngineConfig(prefix_cache_tokens=0)) as eng:
        alone = [await eng.generate(p, params) for p in (long_prompt, *short)]
        for batch, expected in (([long_prompt, *short], 2), (short, 1)):
            await eng.pause("in_place")
            prefills = eng.stats.prefills
            flights = [asyncio.ensure_future(eng.generate(p, params)) for p in batch]
            while eng.running < len(batch):
                await asyncio.sleep(0.005)
            await eng.continue_generation()
            results = await asyncio.gather(*flights)
            assert eng.stats.prefills - prefills == expected
            assert [g.output_ids for g in results] == [g.output_ids for g in alone[len(alone) - len(batch) :]]
