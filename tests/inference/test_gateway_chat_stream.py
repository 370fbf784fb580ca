"""Streamed chat completions on a gateway session (``stream: true``), through the official ``openai`` package:
the chunks assemble to the answer ``stream: false`` gives, tool calls as OpenAI's deltas, the usage chunk, and
the session stays token-exact."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from sandrl.inference.gateway import Gateway, create_gateway_app
from sandrl.inference.server import BackgroundServer

from ..chat_families import BASH_TOOL
from .conftest import Served
from .test_gateway import RunnerGateway, ScriptedReplies, _record, _session


@pytest.fixture
def scripted_gateway() -> Iterator[RunnerGateway]:
    """The runner's gateway in front of a policy that calls bash, then says it is done."""
    call = json.dumps({"name": "bash", "arguments": {"command": "ls -la"}})
    policy = ScriptedReplies([f"<think>ls first</think>Looking.\n<tool_call>\n{call}\n</tool_call>", "Done."])
    gateway = Gateway(policy, model_name="scripted")  # type: ignore[arg-type]
    with BackgroundServer(create_gateway_app(gateway)) as server:
        yield RunnerGateway(gateway, server.url, policy)


def _assembled(chunks: list[Any]) -> dict[str, Any]:
    """A message from its chunks, the way OpenAI-compatible clients (litellm, OpenHands, Qwen Code) put it together."""
    message: dict[str, Any] = {"content": None, "tool_calls": {}, "reasoning": ""}
    finish, usage, logprobs = None, None, []
    for chunk in chunks:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            delta = choice.delta
            message["reasoning"] += getattr(delta, "reasoning_content", None) or ""  # vLLM's field
            if delta.content is not None:
                message["content"] = (message["content"] or "") + delta.content
            for call in delta.tool_calls or ():
                slot = message["tool_calls"].setdefault(call.index, {"id": None, "name": "", "arguments": ""})
                slot["id"] = call.id or slot["id"]
                slot["name"] += (call.function and call.function.name) or ""
                slot["arguments"] += (call.function and call.function.arguments) or ""
            if choice.logprobs and choice.logprobs.content:
                logprobs += [entry.logprob for entry in choice.logprobs.content]
            finish = choice.finish_reason or finish
    calls = [message["tool_calls"][i] for i in sorted(message["tool_calls"])]
    return {
        "content": message["content"],
        "reasoning": message["reasoning"],
        "calls": calls,
        "finish": finish,
        "usage": usage,
        "logprobs": logprobs,
    }


async def test_a_streamed_answer_is_the_answer_under_the_same_seed(served: Served) -> None:
    messages = [{"role": "user", "content": "Say something."}]
    kwargs: dict[str, Any] = {"model": "tiny", "messages": messages, "max_tokens": 16, "seed": 7, "logprobs": True}
    plain_session, stream_session = await _session(served.url), await _session(served.url)
    async with openai.AsyncOpenAI(
        base_url=plain_session["base_url"], api_key=plain_session["api_key"], max_retries=0
    ) as client:
        plain = await client.chat.completions.create(**kwargs)
    # Over {base_url}/v1, as clients configured with an API root append it.
    async with openai.AsyncOpenAI(
        base_url=f"{stream_session['base_url']}/v1", api_key=stream_session["api_key"], max_retries=0
    ) as client:
        stream = await client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
        chunks = [chunk async for chunk in stream]
        assert [model.id async for model in client.models.list()] == ["tiny"]
    got = _assembled(chunks)
    choice = plain.choices[0]
    assert got["content"] == choice.message.content and got["finish"] == choice.finish_reason
    # The second session's prompt came from the engine's prefix cache: the same tokens, float noise in their log-probs.
    assert choice.logprobs is not None
    assert got["logprobs"] == pytest.approx([e.logprob for e in choice.logprobs.content or ()], abs=1e-4)
    assert plain.usage is not None and got["usage"] is not None
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert [getattr(got["usage"], k) for k in counts] == [getattr(plain.usage, k) for k in counts]
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].choices == []
    assert (await _record(served.url, plain_session))["ids"] == (await _record(served.url, stream_session))["ids"]


async def test_streamed_tool_calls_assemble_and_the_next_turn_extends_the_session(
    scripted_gateway: RunnerGateway,
) -> None:
    opened = scripted_gateway.open()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "list the files"}]
    async with openai.AsyncOpenAI(base_url=opened["base_url"], api_key=opened["api_key"], max_retries=0) as client:
        stream = await client.chat.completions.create(
            model="m",
            messages=messages,  # type: ignore[arg-type]
            tools=[BASH_TOOL],  # type: ignore[list-item]
            stream=True,
        )
        chunks = [chunk async for chunk in stream]
        got = _assembled(chunks)
        assert got["content"] == "Looking." and got["finish"] == "tool_calls" and got["usage"] is None
        assert got["reasoning"] == "ls first"
        [call] = got["calls"]
        assert call["name"] == "bash" and json.loads(call["arguments"]) == {"command": "ls -la"} and call["id"]
        # The call's name comes once, with its id, before its arguments (OpenAI's order).
        deltas = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices and c.choices[0].delta.tool_calls]
        assert [bool(d.id) for d in deltas] == [True, False] and deltas[0].function.arguments == ""
        assistant = {
            "role": "assistant",
            "content": got["content"],
            "tool_calls": [
                {"id": call["id"], "type": "function", "function": {"name": "bash", "arguments": call["arguments"]}}
            ],
        }
        messages += [assistant, {"role": "tool", "tool_call_id": call["id"], "content": "a.txt"}]
        # The openai package's own accumulator (chat.completions.stream) reads the same stream.
        async with client.chat.completions.stream(model="m", messages=messages, tools=[BASH_TOOL]) as events:  # type: ignore[arg-type,list-item]
            final: Any = await events.get_final_completion()
    assert final.choices[0].message.content == "Done." and final.choices[0].finish_reason == "stop"
    record = scripted_gateway.gateway.get(opened["id"]).record()
    assert record["segment_starts"] == [0] and [t["new_segment"] for t in record["turns"]] == [True, False]
    assert scripted_gateway.policy.calls[1] == record["ids"][: record["turns"][1]["output_start"]]


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"stream": True, "n": 2}, "n must be 1"),
        ({"stream": True, "tool_choice": "required"}, "tool_choice"),
        ({"stream_options": {"include_usage": True}}, "stream_options: needs stream=true"),
        ({"stream": True, "stream_options": {"continuous_usage_stats": True}}, "stream_options"),
    ],
)
async def test_what_a_stream_cannot_honour_is_refused_by_name(
    scripted_gateway: RunnerGateway, extra: dict[str, Any], words: str
) -> None:
    opened = scripted_gateway.open()
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], **extra}
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {opened['api_key']}"}) as http:
        r = await http.post(f"{opened['base_url']}/chat/completions", json=body)
    assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
    assert not scripted_gateway.policy.calls
