"""The embedded engine's prefix cache: a request that extends a finished one computes only its suffix.

Every test compares an engine with the cache (the default) against one without (``prefix_cache_tokens=0``):
the same token ids, and log-probs within the tolerance batching already has (1e-4 in float32,
``test_engine.py``; the measured gap is about 1e-6, another summation order).
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch
from transformers import DynamicCache
from typer.testing import CliRunner

from sandrl.cli import app as cli
from sandrl.errors import ConfigError
from sandrl.inference import server as server_module
from sandrl.inference.base import Generation, SamplingParams
from sandrl.inference.batch import Partial
from sandrl.inference.engine import Engine, EngineConfig
from sandrl.inference.model import build_tiny_model
from sandrl.inference.prefix_cache import PrefixCache, common_prefix
from sandrl.inference.server import BackgroundServer, create_app
from sandrl.inference.tokenizer import ByteTokenizer
from tests.inference.lora_support import policy_logprobs, train_and_export

ForwardLogprobs = Callable[[Any, list[int], list[int]], list[float]]

TOLERANCE = 1e-4
GREEDY = SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=True)
SAMPLED = SamplingParams(temperature=1.0, max_new_tokens=12, ignore_eos=True, seed=7)


@pytest.fixture
def engines() -> Iterator[tuple[Engine, Engine]]:
    """An engine with the prefix cache and one without, on the same weights."""
    on, off = Engine.load("tiny"), Engine.load("tiny", EngineConfig(prefix_cache_tokens=0))
    yield on, off
    on.close()
    off.close()


def _opening(tok: ByteTokenizer, text: str) -> list[int]:
    return tok.encode_messages([{"role": "user", "content": text}], add_generation_prompt=True)


def _next_turn(tok: ByteTokenizer, prompt: list[int], output: list[int], observation: str) -> list[int]:
    """What an agent sends next: the same ids, the model's output as sampled, then the observation's turn."""
    return prompt + output + tok.encode_messages([{"role": "tool", "content": observation}])[1:]


async def _together(engine: Engine, prompts: list[list[int]], params: list[SamplingParams]) -> list[Generation]:
    """Queue all, then start: the same batches on every run (and none finishes, and is stored, before the others
    are admitted). Which rows share a forward moves logits by ~1e-7, enough to move a sampled token now and then."""
    await engine.pause("in_place")
    flights = [asyncio.ensure_future(engine.generate(p, sp)) for p, sp in zip(prompts, params, strict=True)]
    while engine.running < len(prompts):
        await asyncio.sleep(0.005)
    await engine.continue_generation()
    return list(await asyncio.gather(*flights))


def _same(a: Generation, b: Generation) -> None:
    assert a.output_ids == b.output_ids
    assert max(abs(x - y) for x, y in zip(a.output_logprobs, b.output_logprobs, strict=True)) < TOLERANCE


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
async def test_the_next_turn_computes_only_its_suffix_and_generates_the_same(
    engines: tuple[Engine, Engine], tokenizer: ByteTokenizer, params: SamplingParams
) -> None:
    on, off = engines
    prompt = _opening(tokenizer, "list the files")
    previous = 0  # the last turn's prompt and output
    for turn in range(3):
        before = on.stats.prefill_tokens, on.stats.cached_tokens
        with_cache, without = await on.generate(prompt, params), await off.generate(prompt, params)
        _same(with_cache, without)
        assert without.cached_tokens == 0
        # All of the last turn's tokens but its last output token (no forward saw it).
        assert with_cache.cached_tokens == max(previous - 1, 0)
        computed = on.stats.prefill_tokens - before[0]
        assert computed == len(prompt) - with_cache.cached_tokens
        assert on.stats.cached_tokens - before[1] == with_cache.cached_tokens
        previous = len(prompt) + len(with_cache.output_ids)
        prompt = _next_turn(tokenizer, prompt, with_cache.output_ids, f"output of turn {turn}")
    assert on.prefix_cache.entries == 1  # each turn's entry replaced the one it extends


async def test_a_prompt_equal_to_a_cached_sequence_recomputes_its_last_token(
    engines: tuple[Engine, Engine], tokenizer: ByteTokenizer
) -> None:
    on, off = engines
    prompt = _opening(tokenizer, "same again")
    first = await on.generate(prompt, GREEDY)
    again = prompt + first.output_ids[:-1]  # exactly the tokens whose KV is cached
    with_cache, without = await on.generate(again, GREEDY), await off.generate(again, GREEDY)
    assert with_cache.cached_tokens == len(again) - 1
    _same(with_cache, without)


async def test_concurrent_requests_with_and_without_cached_prefixes_are_exact(
    engines: tuple[Engine, Engine], tokenizer: ByteTokenizer, forward_logprobs: ForwardLogprobs
) -> None:
    """One prefill may mix rows with long, short and no cached prefixes (padding between prefix and suffix)."""
    on, off = engines
    opening = _opening(tokenizer, "a shared task")
    first = await on.generate(opening, GREEDY)
    base = opening + first.output_ids
    # Suffixes of about the same length, so that admission puts them in the same prefill.
    prompts = [
        _next_turn(tokenizer, opening, first.output_ids, "an observation"),
        _next_turn(tokenizer, opening, first.output_ids, "another, longer one"),
        opening + tokenizer.encode("diverges inside the reply"),
        _opening(tokenizer, "unrelated"),
        _opening(tokenizer, "unrelated and longer"),
    ]
    params = [GREEDY if i % 2 else SamplingParams(max_new_tokens=10, ignore_eos=True, seed=i) for i in range(5)]
    before = on.stats.prefill_tokens, on.stats.prefills
    with_cache = await _together(on, prompts, params)
    assert on.stats.prefills - before[1] < len(prompts), "rows with different cached prefixes must share a prefill"
    without = await _together(off, prompts, params)
    for prompt, a, b in zip(prompts, with_cache, without, strict=True):
        _same(a, b)
        reference = forward_logprobs(on.model, prompt, a.output_ids)
        assert max(abs(x - y) for x, y in zip(a.output_logprobs, reference, strict=True)) < TOLERANCE
    cached = [g.cached_tokens for g in with_cache]
    assert cached[0] == cached[1] == len(base) - 1
    assert len(opening) <= cached[2] < len(base) - 1
    assert 0 < cached[3] < len(opening)  # the chat template's head
    assert on.stats.prefill_tokens - before[0] == sum(len(p) for p in prompts) - sum(cached)


async def test_the_cache_is_bounded_and_evicts_the_least_recently_used(tokenizer: ByteTokenizer) -> None:
    # Raw ids with distinct first tokens: no two sequences share a prefix. Each stores 20 + 8 - 1 = 27 tokens.
    params = SamplingParams(temperature=0, max_new_tokens=8, ignore_eos=True)
    async with Engine.load("tiny", EngineConfig(prefix_cache_tokens=90)) as eng:
        outputs = {}
        for first in (10, 11, 12):
            outputs[first] = (await eng.generate([first] * 20, params)).output_ids
        assert (eng.prefix_cache.entries, eng.prefix_cache.tokens) == (3, 81)
        # A lookup of 10's sequence makes it the most recent: the next store evicts 11's, not 10's.
        hit = await eng.generate([10] * 20 + outputs[10][:-1] + [99], SamplingParams(max_new_tokens=1))
        assert hit.cached_tokens == 27
        assert (eng.prefix_cache.entries, eng.prefix_cache.tokens) == (3, 82)  # 28 tokens replaced 10's 27
        await eng.generate([13] * 20, params)
        assert (eng.prefix_cache.tokens, eng.prefix_cache.evictions) == (82, 1)
        assert (await eng.generate([12] * 20 + outputs[12][:-1] + [99], params)).cached_tokens == 27
        assert (await eng.generate([10] * 20 + outputs[10][:-1] + [99], params)).cached_tokens == 27
        assert (await eng.generate([11] * 20 + outputs[11][:-1] + [99], params)).cached_tokens == 0
        # A sequence longer than the whole budget is not kept.
        await eng.generate([14] * 100, params)
        assert (await eng.generate([14] * 100 + [1], params)).cached_tokens == 0
        assert eng.prefix_cache.tokens <= 90


def test_lru_order_and_covered_prefixes_in_the_store() -> None:
    model, _ = build_tiny_model()
    cache = PrefixCache(9, DynamicCache(config=model.config))
    kv = [(torch.zeros(1, 2, 4, 16), torch.zeros(1, 2, 4, 16))]
    cache.insert([1, 2, 3, 4], kv)
    cache.insert([5, 6, 7], kv)
    cache.insert([1, 2], kv)  # covered by [1, 2, 3, 4]: kept once, and marked recent
    assert (cache.entries, cache.tokens) == (2, 7)
    cache.insert([8, 9, 9], kv)  # 10 tokens would overflow 9: [5, 6, 7] is the least recently used
    assert (cache.entries, cache.tokens, cache.evictions) == (2, 7, 1)
    cache.insert([8, 9, 9, 9], kv)  # extends [8, 9, 9]: replaces it, evicting nothing
    assert (cache.entries, cache.tokens, cache.evictions) == (2, 8, 1)
    cache.insert(list(range(11)), kv)  # longer than the budget
    assert cache.tokens == 8
    cache.clear()
    assert (cache.entries, cache.tokens, cache.epoch) == (0, 0, 1)
    assert [common_prefix(a, b) for a, b in [([], [1]), ([1, 2, 3], [1, 2, 4]), ([1, 2], [1, 2, 3]), ([2], [1])]] == [
        0,
        2,
        2,
        0,
    ]


def test_sliding_window_models_get_no_cache_and_bad_budgets_are_refused(forward_logprobs: ForwardLogprobs) -> None:
    class Sliding:
        pass

    class Windowed:
        def __init__(self) -> None:
            self.layers = [Sliding()]

    assert PrefixCache(1000, Windowed()).max_tokens == 0
    with pytest.raises(ConfigError, match="prefix_cache_tokens must be >= 0"):
        EngineConfig(prefix_cache_tokens=-1)


def test_serve_inference_takes_the_cache_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Engine] = []
    # uvicorn's edge: the app is built, nothing is bound
    monkeypatch.setattr(server_module.uvicorn, "run", lambda app, **_: seen.append(app.state.engine))
    result = CliRunner().invoke(cli, ["serve", "inference", "--prefix-cache-tokens", "0", "--port", "1"])
    assert result.exit_code == 0, result.output
    assert seen[0].prefix_cache.max_tokens == 0
    seen[0].close()
    bad = CliRunner().invoke(cli, ["serve", "inference", "--prefix-cache-tokens", "-5"])
    assert bad.exit_code != 0 and "0 turns the prefix cache off" in str(bad.exception or bad.output)


async def test_a_weight_update_drops_the_cache(
    tokenizer: ByteTokenizer, other_checkpoint: Path, forward_logprobs: ForwardLogprobs
) -> None:
    opening = _opening(tokenizer, "before the update")
    fresh_config = EngineConfig(prefix_cache_tokens=0)
    async with Engine.load("tiny") as eng, Engine.load(str(other_checkpoint), fresh_config) as fresh:
        first = await eng.generate(opening, GREEDY)
        second = _next_turn(tokenizer, opening, first.output_ids, "obs")
        assert eng.prefix_cache.entries == 1
        await eng.update_weights(str(other_checkpoint))
        assert eng.prefix_cache.entries == 0
        after = await eng.generate(second, GREEDY)
        assert after.cached_tokens == 0
        _same(after, await fresh.generate(second, GREEDY))
        # Its KV (new weights) is kept; the next turn reuses it and still matches a fresh engine.
        third = _next_turn(tokenizer, second, after.output_ids, "obs 2")
        reused = await eng.generate(third, GREEDY)
        assert reused.cached_tokens == len(second) + len(after.output_ids) - 1
        _same(reused, await fresh.generate(third, GREEDY))
        await eng.flush_cache()
        assert eng.prefix_cache.entries == 0
        assert (await eng.generate(third, GREEDY)).cached_tokens == 0


async def test_a_request_decoded_across_an_in_place_update_stores_nothing(
    tokenizer: ByteTokenizer, other_checkpoint: Path
) -> None:
    """Its KV holds tokens of both weights: reusing it would give neither model's numbers."""
    opening = _opening(tokenizer, "in flight")
    long = SamplingParams(temperature=0, max_new_tokens=600, ignore_eos=True)
    async with Engine.load("tiny", EngineConfig(update_policy="in_place")) as eng:
        stream = eng.stream(opening, long)
        async for out in stream:
            if isinstance(out, Partial):
                break  # decoding has started
        update = asyncio.ensure_future(eng.update_weights(str(other_checkpoint)))
        final = None
        async for out in stream:
            final = out
        await update
        assert isinstance(final, Generation) and final.output_weight_versions is not None
        assert set(final.output_weight_versions) == {0, 1}, "the update must land mid-generation"
        assert eng.prefix_cache.entries == 0
        again = await eng.generate(_next_turn(tokenizer, opening, final.output_ids, "obs"), GREEDY)
        assert again.cached_tokens == 0


async def test_requests_naming_an_adapter_neither_reuse_nor_leave_kv(tmp_path: Path) -> None:
    """An adapter's KV is not the base's: a request with ``lora`` computes its whole prompt and stores nothing."""
    trained = train_and_export(tmp_path)
    tok = trained.tokenizer
    async with Engine(copy.deepcopy(trained.base), tok) as eng:
        await eng.load_lora_adapter("a", str(trained.adapter))
        opening = _opening(tok, "the adapter learns")
        first = await eng.generate(opening, GREEDY)  # the base's KV, stored
        second = _next_turn(tok, opening, first.output_ids, "obs")
        adapted = await eng.generate(second, GREEDY, lora="a")
        assert adapted.cached_tokens == 0
        reference = policy_logprobs(trained.policy, second, adapted.output_ids)
        assert max(abs(a - b) for a, b in zip(adapted.output_logprobs, reference, strict=True)) < TOLERANCE
        # The base's next turn finds the base's sequence, not the adapter's longer one.
        third = _next_turn(tok, second, adapted.output_ids, "obs 2")
        assert (await eng.generate(third, GREEDY)).cached_tokens == len(opening) + len(first.output_ids) - 1


@pytest.fixture
async def server() -> AsyncIterator[httpx.AsyncClient]:
    """A server of its own: the shared one's cache holds other tests' sequences."""
    eng = Engine.load("tiny")
    with BackgroundServer(create_app(eng)) as background:
        async with httpx.AsyncClient(base_url=background.url, timeout=60) as client:
            yield client
    eng.close()


async def test_the_routes_report_cached_tokens_as_sglang_and_openai_do(
    server: httpx.AsyncClient, tokenizer: ByteTokenizer
) -> None:
    opening = _opening(tokenizer, "over http")
    params = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
    first = (await server.post("/generate", json={"input_ids": opening, "sampling_params": params})).json()
    assert first["meta_info"]["cached_tokens"] == 0
    second = _next_turn(tokenizer, opening, first["output_ids"], "obs")
    answer = (await server.post("/generate", json={"input_ids": second, "sampling_params": params})).json()
    expected = len(opening) + 8 - 1
    assert answer["meta_info"]["cached_tokens"] == expected
    assert answer["meta_info"]["prompt_tokens"] == len(second)

    body = {"model": "tiny", "prompt": second, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    usage = (await server.post("/v1/completions", json=body)).json()["usage"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": len(second) - 1}  # the last request stored it all
    chunks = []
    other = (answer["output_ids"][0] + 1) % 256  # not the cached continuation of ``second``
    stream_body = {**body, "prompt": [*second, other], "stream": True, "stream_options": {"include_usage": True}}
    async with server.stream("POST", "/v1/completions", json=stream_body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                chunks.append(line)
    last = httpx.Response(200, content=chunks[-1].removeprefix("data: ")).json()
    assert last["usage"]["prompt_tokens_details"]["cached_tokens"] == len(second)
    info = (await server.get("/get_server_info")).json()
    assert info["prefix_cache_tokens"] == EngineConfig().prefix_cache_tokens and info["disable_radix_cache"] is False


async def test_a_gateway_session_reports_what_its_next_turn_reused(server: httpx.AsyncClient) -> None:
    opened = (await server.post("/v1/sessions")).json()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
    usages = []
    async with openai.AsyncOpenAI(base_url=opened["base_url"], api_key=opened["api_key"], max_retries=0) as client:
        for turn in range(2):
            r = await client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, seed=turn)  # type: ignore[arg-type]
            assert r.usage is not None and r.usage.prompt_tokens_details is not None
            usages.append(r.usage)
            messages += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "more"}]
    first, second = usages
    assert first.prompt_tokens_details is not None and first.prompt_tokens_details.cached_tokens == 0
    assert second.prompt_tokens_details is not None
    assert second.prompt_tokens_details.cached_tokens == first.prompt_tokens + first.completion_tokens - 1


async def test_a_burst_sharing_one_prompt_prefills_it_once(
    engines: tuple[Engine, Engine], tokenizer: ByteTokenizer
) -> None:
    """A group's samples arrive together with one prompt: the first prefills it, the others wait one step and
    reuse its KV (SGLang's scheduler does the same within a batch); what they generate is unchanged."""
    on, off = engines
    prompt = _opening(tokenizer, "a long shared task: " + "fix the build and run the tests " * 4)
    assert len(prompt) > 100
    before = on.stats.prefill_tokens
    with_cache = await asyncio.gather(*(on.generate(prompt, GREEDY) for _ in range(8)))
    without = await asyncio.gather(*(off.generate(prompt, GREEDY) for _ in range(8)))
    for a, b in zip(with_cache, without, strict=True):
        _same(a, b)
    computed = on.stats.prefill_tokens - before
    assert computed == len(prompt) + 7  # once, then each sample's last prompt token (its logits start it)
    assert sorted(g.cached_tokens for g in with_cache) == [0] + [len(prompt) - 1] * 7
    # Different openings that share less than MIN_SHARED new tokens are not held back.
    from sandrl.inference.prefix_cache import MIN_SHARED

    short = [_opening(tokenizer, f"task {i}") for i in range(4)]
    assert common_prefix(short[0], short[1]) < MIN_SHARED
    prefills = on.stats.prefills
    await _together(on, short, [GREEDY] * 4)
    assert on.stats.prefills - prefills == 1
