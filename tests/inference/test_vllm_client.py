"""VLLMClient: token-exact sampling through sandrl's OpenAI routes (vLLM's extensions), and weight
reloads under each update policy through a real server with vLLM's dev-mode routes
(:mod:`tests.inference.vllm_dev_server`), with 8 generations in flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandrl.errors import ConfigError
from sandrl.inference.base import Generation, InferenceClient, SamplingParams, UpdatePolicy
from sandrl.inference.engine import Engine
from sandrl.inference.model import build_tiny_model
from sandrl.inference.server import BackgroundServer
from sandrl.inference.tiny_config import TinyModelConfig
from sandrl.inference.tokenizer import ByteTokenizer
from sandrl.inference.version_spans import from_spans, to_spans
from sandrl.inference.vllm import VLLMClient, server_url
from sandrl.wiring.config import ModelConfig
from tests.inference.vllm_dev_server import create_vllm_app

from .decoding import all_decoding

ForwardLogprobs = Callable[[Any, list[int], list[int]], list[float]]
IN_FLIGHT = 8
LONG = 200


def _prompt(tok: ByteTokenizer, text: str) -> list[int]:
    return tok.encode_messages([{"role": "user", "content": text}], add_generation_prompt=True)


def _vllm_url(url: str) -> str:
    return "vllm://" + url.removeprefix("http://")


async def test_vllm_client_gives_what_the_engine_gives(served: Any, tokenizer: ByteTokenizer) -> None:
    prompt = _prompt(tokenizer, "same answer")
    params = SamplingParams(max_new_tokens=12, seed=17, ignore_eos=True, top_logprobs=2)
    direct = await served.engine.generate(prompt, params)
    async with VLLMClient(_vllm_url(served.url)) as client:
        assert isinstance(client, InferenceClient)
        await client.health()
        g = await client.generate(prompt, params)
    assert g.output_ids == direct.output_ids
    assert g.output_logprobs == pytest.approx(direct.output_logprobs, abs=1e-6)
    # The per-token versions came as vLLM's spans (return_weight_versions), read back one per token.
    assert g.output_weight_versions == [0] * 12 and (g.start_weight_version, g.weight_version) == (0, 0)


async def test_vllm_client_without_dev_routes_says_how_to_start_vllm(served: Any, other_checkpoint: Path) -> None:
    async with VLLMClient(served.url) as client:
        with pytest.raises(ConfigError, match="VLLM_SERVER_DEV_MODE=1"):
            await client.update_weights(str(other_checkpoint))


async def test_vllm_client_refuses_what_vllm_cannot_honour(served: Any) -> None:
    async with VLLMClient(served.url) as client:
        with pytest.raises(ConfigError, match="logit_bias"):
            await client.generate([1, 2], SamplingParams(logit_bias=((3, 1.0),)))
        with pytest.raises(ConfigError, match="--logprobs-mode processed_logprobs"):
            await client.generate([1, 2], SamplingParams(temperature=0.7, scaled_logprobs=True))
    with pytest.raises(ConfigError, match="update_policy"):
        VLLMClient(served.url, update_policy="later")  # type: ignore[arg-type]


def test_vllm_urls_and_model_config() -> None:
    assert server_url("vllm://127.0.0.1:8000") == "http://127.0.0.1:8000"
    assert server_url("http://h:1/") == "http://h:1"
    for bad in ("vllm://", "vllm://h:1/v1", "grpc://h:1"):
        with pytest.raises(ConfigError, match="vllm://HOST:PORT"):
            server_url(bad)
    assert ModelConfig(inference="vllm://10.0.0.1:8000").api == "vllm"
    assert ModelConfig(inference="http://10.0.0.1:8000", api="vllm").api == "vllm"
    with pytest.raises(ConfigError, match="api is 'openai'"):
        ModelConfig(inference="vllm://h:1", api="openai")
    with pytest.raises(ConfigError, match="vllm://HOST:PORT"):
        ModelConfig(inference="vllm://h:1/v1")


def test_weight_version_spans_round_trip() -> None:
    versions = [0, 0, 3, 3, 3, 4]
    spans = to_spans(versions)
    assert spans == [
        {"version": "0", "start": 0, "end": 2},
        {"version": "3", "start": 2, "end": 5},
        {"version": "4", "start": 5, "end": 6},
    ]
    assert from_spans(spans, 6) == versions
    assert from_spans([{"version": "default", "start": 0, "end": 2}], 2) == [0, 0]
    # Anything that does not cover the output exactly is not guessed at.
    assert from_spans(spans, 7) is None
    assert from_spans([{"version": "v1", "start": 0, "end": 1}], 1) is None
    assert from_spans(None, 3) is None and from_spans([], 0) == []


@pytest.fixture
def vllm_served() -> Iterator[tuple[Engine, str, list[str]]]:
    """sandrl's engine behind vLLM's route shapes; its weights change."""
    engine = Engine.load("tiny")
    app = create_vllm_app(engine)
    with BackgroundServer(app) as server:
        yield engine, _vllm_url(server.url), app.state.log
    engine.close()


@pytest.fixture(scope="module")
def models() -> tuple[Any, Any]:
    return build_tiny_model(TinyModelConfig())[0], build_tiny_model(TinyModelConfig(seed=1))[0]


async def _in_flight(client: VLLMClient, engine: Engine, prompts: list[list[int]]) -> list[asyncio.Future[Generation]]:
    params = SamplingParams(max_new_tokens=LONG, ignore_eos=True, seed=5, temperature=1.0)
    steps = engine.stats.steps
    flights = [asyncio.ensure_future(client.generate(p, params)) for p in prompts]
    for _ in range(4000):
        if all_decoding(engine, len(prompts), steps):
            break
        await asyncio.sleep(0.005)
    assert not any(f.done() for f in flights), "the update must land while requests are decoding"
    return flights


@pytest.mark.parametrize("policy", ["pause", "in_place", "abort_and_resume"])
async def test_vllm_weight_reload_under_each_policy(
    policy: UpdatePolicy,
    vllm_served: tuple[Engine, str, list[str]],
    tokenizer: ByteTokenizer,
    other_checkpoint: Path,
    models: tuple[Any, Any],
    forward_logprobs: ForwardLogprobs,
) -> None:
    engine, url, log = vllm_served
    prompts = [_prompt(tokenizer, f"task {i}" * (i + 1)) for i in range(IN_FLIGHT)]
    async with VLLMClient(url, update_policy=policy) as client:
        flights = await _in_flight(client, engine, prompts)
        update = asyncio.ensure_future(client.update_weights(str(other_checkpoint), version=7))
        while client._open.is_set():
            await asyncio.sleep(0.001)
        # Sent while the update runs: it waits for it on the client side, and runs on the new weights.
        late = asyncio.ensure_future(client.generate(prompts[0], SamplingParams(max_new_tokens=10, seed=1)))
        assert await update == 7
        results = await asyncio.gather(*flights)
        after = await late
        assert await client.weight_version() == 7
    assert "503" not in log, "the client's own requests never meet vLLM's 503 during its update"
    mode = {"pause": "wait", "in_place": "keep", "abort_and_resume": "keep"}[policy]
    expected = [f"pause:{mode}", "reload_weights", "version:7", "resume"]
    if policy == "abort_and_resume":
        expected.insert(2, "reset_prefix_cache:True")
    assert log == expected
    assert after.output_weight_versions == [7] * 10
    for prompt, g in zip(prompts, results, strict=True):
        assert g.finish_reason == "length" and len(g.output_ids) == LONG  # nothing lost, whatever the policy
        versions = g.output_weight_versions
        assert versions is not None
        if policy == "pause":  # finished on the old weights before the reload
            assert versions == [0] * LONG and g.weight_version == 0
            continue
        switch = versions.index(7)
        assert 0 < switch < LONG and versions == [0] * switch + [7] * (LONG - switch)
        assert (g.start_weight_version, g.weight_version) == (0, 7)
        old = forward_logprobs(models[0], prompt, g.output_ids[:switch])
        assert max(abs(a - b) for a, b in zip(g.output_logprobs[:switch], old, strict=True)) < 1e-4
        if policy == "abort_and_resume":  # resumed over a cache recomputed by the new weights
            new = forward_logprobs(models[1], prompt, g.output_ids)[switch:]
            assert max(abs(a - b) for a, b in zip(g.output_logprobs[switch:], new, strict=True)) < 1e-4


async def test_return_weight_versions_is_refused_with_stream(served: Any) -> None:
    body = {"model": "tiny", "prompt": [1, 2], "max_tokens": 2, "stream": True, "return_weight_versions": True}
    async with httpx.AsyncClient(base_url=served.url) as http:
        answer = await http.post("/v1/completions", json=body)
    assert answer.status_code == 400 and "return_weight_versions" in answer.json()["message"]
