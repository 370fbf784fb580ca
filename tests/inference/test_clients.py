"""SGLangClient and OpenAIClient against the real server, and their retry and error policy.

Against the server both clients must give exactly what the engine gives in process for the
same seed: the same ids and the same log-probs. The transport tests fake only the edge: a
closed port for "connection refused", httpx.MockTransport for status codes.
"""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandrl.errors import ConfigError, InferenceError
from sandrl.inference.base import InferenceClient, SamplingParams, UpdatePolicy
from sandrl.inference.openai import OpenAIClient
from sandrl.inference.sglang import SGLangClient
from sandrl.inference.tokenizer import ByteTokenizer
from sandrl.inference.transport import HTTPConfig

FAST_RETRY = HTTPConfig(retries=2, backoff_s=0.05, backoff_max_s=0.1, connect_timeout_s=1)


def _prompt(tok: ByteTokenizer, text: str) -> list[int]:
    return tok.encode_messages([{"role": "user", "content": text}], add_generation_prompt=True)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.mark.parametrize("kind", ["sglang", "openai-completions", "openai-chat"])
async def test_client_gives_what_the_engine_gives(kind: str, served: Any, tokenizer: ByteTokenizer) -> None:
    prompt = _prompt(tokenizer, "same answer")
    params = SamplingParams(max_new_tokens=12, seed=17, ignore_eos=True, top_logprobs=2)
    direct = await served.engine.generate(prompt, params)
    client: SGLangClient | OpenAIClient
    if kind == "sglang":
        client = SGLangClient(served.url)
    elif kind == "openai-completions":
        client = OpenAIClient(served.url + "/v1")
    else:
        client = OpenAIClient(served.url, mode="chat", chat_parser=tokenizer)
    async with client:
        assert isinstance(client, InferenceClient)
        await client.health()
        g = await client.generate(prompt, params)
    assert g.output_ids == direct.output_ids
    assert g.output_logprobs == pytest.approx(direct.output_logprobs, abs=1e-6)
    assert (g.finish_reason, g.prompt_tokens, g.weight_version) == ("length", len(prompt), 0)
    assert g.output_top_logprobs is not None and direct.output_top_logprobs is not None
    assert [[t for t, _ in row] for row in g.output_top_logprobs] == [
        [t for t, _ in row] for row in direct.output_top_logprobs
    ]


@pytest.mark.parametrize("kind", ["sglang", "openai"])
async def test_client_stops_on_stop_token(kind: str, served: Any, tokenizer: ByteTokenizer) -> None:
    prompt = _prompt(tokenizer, "stop")
    free = await served.engine.generate(prompt, SamplingParams(temperature=0, max_new_tokens=16, ignore_eos=True))
    stop = free.output_ids[4]
    params = SamplingParams(temperature=0, max_new_tokens=16, ignore_eos=True, stop_token_ids=(stop,))
    client = SGLangClient(served.url) if kind == "sglang" else OpenAIClient(served.url)
    async with client:
        g = await client.generate(prompt, params)
    assert g.output_ids == free.output_ids[: free.output_ids.index(stop) + 1]
    assert (g.finish_reason, g.matched_stop) == ("stop", stop)


@pytest.mark.parametrize("kind", ["sglang", "openai"])
async def test_client_updates_weights(kind: str, fresh_served: Any, other_checkpoint: Path) -> None:
    http = HTTPConfig(api_key=fresh_served.token)  # the trainer's server has a token: weight updates need it
    url = fresh_served.url
    client = SGLangClient(url, http=http) if kind == "sglang" else OpenAIClient(url, http=http)
    async with client:
        assert await client.update_weights(str(other_checkpoint)) == 1
        assert await client.update_weights(str(other_checkpoint)) == 2
        g = await client.generate([1, 2, 3], SamplingParams(max_new_tokens=2))
        assert g.weight_version == 2 == fresh_served.engine.weight_version
        with pytest.raises((ConfigError, InferenceError), match="does not exist"):
            await client.update_weights("/no/such/checkpoint")


async def test_bad_request_is_a_config_error_with_the_servers_message(served: Any) -> None:
    async with SGLangClient(served.url) as client:
        with pytest.raises(ConfigError, match="outside the model's vocabulary"):
            await client.generate([10**6], SamplingParams())
    async with OpenAIClient(served.url, model="not-served") as client:
        with pytest.raises(ConfigError, match="serves the model 'tiny'") as info:
            await client.generate([1], SamplingParams())
        assert info.value.http_status == 404 and info.value.error_code == "model_not_found"


async def test_chat_mode_needs_an_open_assistant_turn(served: Any, tokenizer: ByteTokenizer) -> None:
    async with OpenAIClient(served.url, mode="chat", chat_parser=tokenizer) as client:
        with pytest.raises(ConfigError, match="end with the assistant prefix"):
            await client.generate(tokenizer.encode_messages([{"role": "user", "content": "x"}]), SamplingParams())
    with pytest.raises(ConfigError, match="needs a chat_parser"):
        OpenAIClient(served.url, mode="chat")


@pytest.mark.parametrize("kind", ["sglang", "openai"])
async def test_connection_refused_is_retried_then_a_typed_error(kind: str) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    client = SGLangClient(url, http=FAST_RETRY) if kind == "sglang" else OpenAIClient(url, "tiny", http=FAST_RETRY)
    started = time.monotonic()
    async with client:
        with pytest.raises(InferenceError) as info:
            await client.generate([1], SamplingParams())
    assert time.monotonic() - started >= 0.05 + 0.1, "two backoffs must have been waited"
    assert info.value.error_code == "inference_unreachable"
    assert f"inference server at {url}" in info.value.message and "is not reachable" in info.value.message
    assert "3 attempts" in info.value.message and "sandrl serve inference" in info.value.message


def _counting(responses: list[httpx.Response | Exception]) -> tuple[httpx.MockTransport, list[str]]:
    calls: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        item = responses[min(len(calls), len(responses)) - 1]
        if isinstance(item, Exception):
            raise item
        return item

    return httpx.MockTransport(handle), calls


_OK = {
    "text": "",
    "output_ids": [5],
    "meta_info": {
        "finish_reason": {"type": "length", "length": 1},
        "prompt_tokens": 1,
        "weight_version": "default",
        "output_token_logprobs": [[-0.5, 5, None]],
    },
}


async def test_a_server_that_comes_up_late_is_waited_for() -> None:
    transport, calls = _counting(
        [httpx.ConnectError("refused"), httpx.Response(503, json={"message": "loading"}), httpx.Response(200, json=_OK)]
    )
    async with SGLangClient("http://sglang.test", http=FAST_RETRY, transport=transport) as client:
        g = await client.generate([1], SamplingParams(max_new_tokens=1))
    assert len(calls) == 3
    # SGLang's version is "default" until set: the client counts from 0.
    assert (g.output_ids, g.output_logprobs, g.weight_version) == ([5], [-0.5], 0)


async def test_4xx_is_not_retried() -> None:
    transport, calls = _counting([httpx.Response(400, json={"object": "error", "message": "bad prompt"})])
    async with SGLangClient("http://sglang.test", http=FAST_RETRY, transport=transport) as client:
        with pytest.raises(ConfigError, match="answered 400: bad prompt"):
            await client.generate([1], SamplingParams())
    assert len(calls) == 1


async def test_500_is_an_inference_error_and_not_json_is_reported() -> None:
    transport, calls = _counting([httpx.Response(500, json={"error_code": "internal_error", "message": "boom"})])
    async with SGLangClient("http://sglang.test", http=FAST_RETRY, transport=transport) as client:
        with pytest.raises(InferenceError, match="answered 500: boom"):
            await client.generate([1], SamplingParams())
    assert len(calls) == 1
    transport, _ = _counting([httpx.Response(200, text="<html>hello</html>")])
    async with SGLangClient("http://sglang.test", http=FAST_RETRY, transport=transport) as client:
        with pytest.raises(InferenceError, match="not JSON"):
            await client.generate([1], SamplingParams())


async def test_openai_answer_without_token_ids_is_refused() -> None:
    """A server that ignores the token-id extensions cannot be used token-exactly: say so, do not guess."""
    answer = {
        "choices": [
            {"text": "hi", "finish_reason": "length", "logprobs": {"tokens": ["h", "i"], "token_logprobs": [-1, -2]}}
        ]
    }
    transport, _ = _counting([httpx.Response(200, json=answer)])
    async with OpenAIClient("http://vllm.test/v1", "m", http=FAST_RETRY, transport=transport) as client:
        with pytest.raises(InferenceError, match="return_tokens_as_token_ids"):
            await client.generate([1], SamplingParams())


async def test_vllm_style_token_id_strings_are_parsed() -> None:
    answer = {
        "choices": [
            {
                "text": "hi",
                "finish_reason": "stop",
                "stop_reason": None,
                "logprobs": {"tokens": ["token_id:104", "token_id:105"], "token_logprobs": [-1.0, -2.0]},
            }
        ],
        "usage": {"prompt_tokens": 3},
    }
    transport, _ = _counting([httpx.Response(200, json=answer)])
    async with OpenAIClient("http://vllm.test/v1", "m", http=FAST_RETRY, transport=transport) as client:
        g = await client.generate([1, 2, 3], SamplingParams())
    assert (g.output_ids, g.output_logprobs, g.finish_reason, g.prompt_tokens) == ([104, 105], [-1.0, -2.0], "stop", 3)


async def test_update_weights_on_a_server_without_the_route_says_so() -> None:
    transport, _ = _counting([httpx.Response(404, json={"detail": "Not Found"})])
    async with OpenAIClient("http://vllm.test/v1", "m", http=FAST_RETRY, transport=transport) as client:
        with pytest.raises(ConfigError, match="has no /update_weights_from_disk"):
            await client.update_weights("/ckpt")


@pytest.mark.parametrize("policy", ["pause", "in_place", "abort_and_resume"])
async def test_sglang_client_update_policy_and_per_token_versions(
    policy: UpdatePolicy, fresh_served: Any, other_checkpoint: Path
) -> None:
    """Through SGLang's routes (plain update, or pause in_place / retract around it) against sandrl's server,
    which also tells the client which weights produced each token."""
    http = HTTPConfig(api_key=fresh_served.token)
    async with SGLangClient(fresh_served.url, update_policy=policy, http=http) as client:
        params = SamplingParams(max_new_tokens=300, ignore_eos=True, seed=1)
        flight = asyncio.ensure_future(client.generate([1, 2, 3], params))
        while fresh_served.engine.stats.steps < 5:
            await asyncio.sleep(0.005)
        await client.update_weights(str(other_checkpoint), version=3)
        g = await flight
        assert not fresh_served.engine.paused
    versions = g.output_weight_versions
    assert versions is not None and len(versions) == 300 and g.finish_reason == "length"
    if policy == "pause":
        assert set(versions) == {0}  # the update waited for the request
    else:
        assert versions[0] == 0 and versions[-1] == 3 and sorted(versions) == versions
    with pytest.raises(ConfigError, match="update_policy must be one of"):
        SGLangClient(fresh_served.url, update_policy="soon")  # type: ignore[arg-type]
