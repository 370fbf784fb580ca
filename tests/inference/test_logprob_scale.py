"""Log-probs at temperature != 1: which scale each path returns, checked against a teacher-forced
forward pass at the same temperature (tolerance 1e-4, as in test_engine.py)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import torch

from sandrl.errors import ConfigError
from sandrl.inference.base import SamplingParams
from sandrl.inference.engine import Engine
from sandrl.inference.server import BackgroundServer, create_app
from sandrl.inference.sglang import SGLangClient

TOLERANCE = 1e-4
PROMPT = [1, 72, 105, 2, 3]


def _forward(model: Any, prompt: list[int], output: list[int], temperature: float) -> list[float]:
    """Log-probs of ``output`` from one full forward pass, the logits divided by ``temperature``."""
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + output])).logits[0].float()
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    return [float(logprobs[len(prompt) + i - 1, token]) for i, token in enumerate(output)]


def _gap(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


async def test_engine_returns_the_scale_sampling_params_asks_for(engine: Engine) -> None:
    base = SamplingParams(temperature=0.7, max_new_tokens=24, seed=11, ignore_eos=True, top_logprobs=3)
    raw = await engine.generate(PROMPT, base)
    scaled = await engine.generate(PROMPT, SamplingParams(**{**base.__dict__, "scaled_logprobs": True}))
    assert raw.output_ids == scaled.output_ids, "the scale of the reported log-probs must not change the sample"
    assert _gap(raw.output_logprobs, _forward(engine.model, PROMPT, raw.output_ids, 1.0)) < TOLERANCE
    assert _gap(scaled.output_logprobs, _forward(engine.model, PROMPT, raw.output_ids, 0.7)) < TOLERANCE
    assert _gap(raw.output_logprobs, scaled.output_logprobs) > 1e-2  # the two scales really differ here
    # The top entries are on the same scale as the sampled token's.
    assert scaled.output_top_logprobs is not None
    with torch.inference_mode():
        logits = engine.model(input_ids=torch.tensor([PROMPT + raw.output_ids])).logits[0].float()
    at_07 = torch.log_softmax(logits / 0.7, dim=-1)
    for i, row in enumerate(scaled.output_top_logprobs):
        assert all(abs(lp - float(at_07[len(PROMPT) + i - 1, t])) < TOLERANCE for t, lp in row)


async def test_server_is_at_the_temperature_unless_original_is_asked(engine: Engine, monkeypatch: Any) -> None:
    body = {"input_ids": PROMPT, "sampling_params": {"temperature": 0.7, "max_new_tokens": 16, "sampling_seed": 2}}
    body["return_logprob"] = True
    monkeypatch.delenv("SGLANG_RETURN_ORIGINAL_LOGPROB", raising=False)
    with BackgroundServer(create_app(engine)) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            default = (await http.post("/generate", json=body)).json()
            original = (await http.post("/generate", json={**body, "return_original_logprob": True})).json()
            assert (await http.get("/get_server_info")).json()["return_original_logprob"] is False
    ids = default["output_ids"]
    assert original["output_ids"] == ids
    lps = [e[0] for e in default["meta_info"]["output_token_logprobs"]]
    assert _gap(lps, _forward(engine.model, PROMPT, ids, 0.7)) < TOLERANCE  # SGLang's default scale
    lps = [e[0] for e in original["meta_info"]["output_token_logprobs"]]
    assert _gap(lps, _forward(engine.model, PROMPT, ids, 1.0)) < TOLERANCE
    # SGLang's switch, read as SGLang reads it.
    monkeypatch.setenv("SGLANG_RETURN_ORIGINAL_LOGPROB", "1")
    with BackgroundServer(create_app(engine)) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            answer = (await http.post("/generate", json=body)).json()
    lps = [e[0] for e in answer["meta_info"]["output_token_logprobs"]]
    assert _gap(lps, _forward(engine.model, PROMPT, answer["output_ids"], 1.0)) < TOLERANCE


async def test_sglang_client_gets_the_trainers_scale_from_sandrl(served: Any) -> None:
    params = SamplingParams(temperature=0.7, max_new_tokens=16, seed=5, ignore_eos=True)
    async with SGLangClient(served.url) as client:
        g = await client.generate(PROMPT, params)
        scaled = await client.generate(PROMPT, SamplingParams(**{**params.__dict__, "scaled_logprobs": True}))
    assert _gap(g.output_logprobs, _forward(served.engine.model, PROMPT, g.output_ids, 1.0)) < TOLERANCE
    assert _gap(scaled.output_logprobs, _forward(served.engine.model, PROMPT, g.output_ids, 0.7)) < TOLERANCE


async def test_sglang_client_refuses_an_unknown_scale_on_a_real_sglang() -> None:
    answer = {
        "text": "",
        "output_ids": [5],
        "meta_info": {"output_token_logprobs": [[-0.5, 5, None]], "finish_reason": {"type": "length"}},
    }

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/get_server_info":
            return httpx.Response(200, json={"model_path": "m", "version": "0.5.4"})  # SGLang's: no sandrl marker
        return httpx.Response(200, json=answer)

    transport = httpx.MockTransport(handle)
    hot = SamplingParams(temperature=0.7, max_new_tokens=1)
    async with SGLangClient("http://sglang.test", transport=transport) as client:
        with pytest.raises(ConfigError, match="SGLANG_RETURN_ORIGINAL_LOGPROB=1"):
            await client.generate([1], hot)
        assert (await client.generate([1], SamplingParams(temperature=1.0, max_new_tokens=1))).output_ids == [5]
    async with SGLangClient("http://sglang.test", transport=transport, original_logprobs=True) as client:
        assert (await client.generate([1], hot)).output_logprobs == [-0.5]
        with pytest.raises(ConfigError, match="wanted at the sampling temperature"):
            await client.generate([1], SamplingParams(temperature=0.7, max_new_tokens=1, scaled_logprobs=True))
