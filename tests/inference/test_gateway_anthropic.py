"""The session gateway's Anthropic Messages routes against the official ``anthropic`` client, over real HTTP:
tool use over several turns (plain and streamed) recorded token-exact, a rewritten history as a new
segment, count_tokens, refusals in Anthropic's error shape naming the field, and the session key sent
as ``x-api-key``."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from fastapi import FastAPI

from sandrl.inference.auth import MAX_BODY_BYTES, install_guards
from sandrl.inference.base import FinishReason, Generation, SamplingParams
from sandrl.inference.chat import ChatFormat
from sandrl.inference.gateway import Gateway, create_gateway_app
from sandrl.inference.server import BackgroundServer
from sandrl.inference.tokenizer import ByteTokenizer, model_tokenizer

from ..chat_families import BASH_TOOL, FAMILIES, TemplateReplies
from .conftest import Served
from .test_gateway import RunnerGateway, ScriptedReplies

BASH: dict[str, Any] = {
    "name": "bash",
    "description": "Run a command.",
    "input_schema": BASH_TOOL["function"]["parameters"],
    "cache_control": {"type": "ephemeral"},
}
"""The chat tests' bash tool, as an Anthropic client declares it."""
CALL = json.dumps({"name": "bash", "arguments": {"command": "ls -la"}})
REPLIES = [f"<think>I should list them.</think>Looking.\n<tool_call>\n{CALL}\n</tool_call>", "Done."]
SYSTEM: list[dict[str, Any]] = [
    {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.0.a3f; cc_entrypoint=cli; cch=00000;"},
    {"type": "text", "text": "You are an agent.", "cache_control": {"type": "ephemeral"}},
]
"""Claude Code's system prompt: its attribution block, then the prompt."""


@dataclass
class StopAware(ScriptedReplies):
    """Scripted replies cut as an engine cuts them: at a stop string (kept, and named) or at ``max_new_tokens``."""

    async def generate(self, input_ids: list[int], params: SamplingParams) -> Generation:
        text = self.replies[min(len(self.calls), len(self.replies) - 1)]
        self.calls.append(list(input_ids))
        matched = next((s for s in params.stop if s in text), None)
        ids = self.tokenizer.encode(text[: text.index(matched) + len(matched)] if matched else text)
        ids = ids if matched else [*ids, self.tokenizer.im_end_id]
        finish: FinishReason = "length" if len(ids) > params.max_new_tokens else "stop"
        ids = ids[: params.max_new_tokens]
        return Generation(ids, [-0.25] * len(ids), finish, 0, len(input_ids), matched_stop=matched)


@pytest.fixture
def scripted() -> Iterator[RunnerGateway]:
    policy = StopAware(REPLIES)
    gateway = Gateway(policy, model_name="scripted")
    with BackgroundServer(create_gateway_app(gateway)) as server:
        yield RunnerGateway(gateway, server.url, policy)


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=30) as client:
        yield client


def _client(opened: dict[str, Any], **kwargs: Any) -> Any:
    """The package's async client of a session (typed Any: its request types do not take plain dicts)."""
    options: dict[str, Any] = {"api_key": opened["api_key"], **kwargs}
    return anthropic.AsyncAnthropic(base_url=opened["base_url"], max_retries=0, **options)


def _sse_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    found = re.findall(r"event: (\w+)\ndata: (.*)\n\n", text)
    return [(kind, json.loads(data)) for kind, data in found]


async def _turn(client: Any, stream: bool, **request: Any) -> Any:
    """One Messages call, plain or through the package's stream helper (which accumulates the events)."""
    if not stream:
        return await client.messages.create(model="claude-sonnet-4-5", **request)
    async with client.messages.stream(model="claude-sonnet-4-5", **request) as events:
        kinds = [event.type async for event in events]
        message = await events.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "message_delta" in kinds
    return message


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
async def test_tool_use_turns_replayed_by_the_client_extend_the_session(
    scripted: RunnerGateway, tokenizer: ByteTokenizer, stream: bool
) -> None:
    policy, opened = scripted.policy, scripted.open()
    messages: list[dict[str, Any]] = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "list the files", "cache_control": {"type": "ephemeral"}}],
        }
    ]
    request: dict[str, Any] = {
        "system": SYSTEM,
        "tools": [BASH],
        "max_tokens": 512,
        "metadata": {"user_id": "u"},
        "thinking": {"type": "enabled", "budget_tokens": 1024},
    }
    async with _client(opened) as client:
        first = await _turn(client, stream, messages=messages, **request)
        assert [block.type for block in first.content] == ["thinking", "text", "tool_use"]
        thinking, text, use = first.content
        assert thinking.thinking == "I should list them." and text.text == "Looking."
        assert use.name == "bash" and use.input == {"command": "ls -la"} and use.id.startswith("toolu_")
        assert first.stop_reason == "tool_use" and first.stop_sequence is None and first.model == "claude-sonnet-4-5"
        assert first.usage.input_tokens == len(policy.calls[0]) and first.usage.cache_read_input_tokens == 0
        assert first.usage.output_tokens == len(tokenizer.encode(REPLIES[0])) + 1
        # The client replays the model's blocks as they came, then the tool's result and a reminder of its own.
        messages += [
            {"role": "assistant", "content": [block.model_dump() for block in first.content]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": use.id, "content": [{"type": "text", "text": "a.txt"}]},
                    {"type": "text", "text": "<system-reminder>go on</system-reminder>"},
                ],
            },
        ]
        second = await _turn(client, stream, messages=messages, **request)
    assert [(b.type, b.text) for b in second.content] == [("text", "Done.")] and second.stop_reason == "end_turn"
    assert second.model_extra is not None and second.model_extra["session"]["new_segment"] is False
    record = scripted.gateway.get(opened["id"]).record()
    assert record["segment_starts"] == [0] and len(record["turns"]) == 2
    # The whole session is the byte template's rendering of the conversation, the attribution block left out.
    conversation = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "list the files"},
        {"role": "assistant", "content": REPLIES[0]},
        {"role": "tool", "content": "a.txt"},
        {"role": "user", "content": "<system-reminder>go on</system-reminder>"},
        {"role": "assistant", "content": "Done."},
    ]
    assert record["ids"] == tokenizer.encode_messages(conversation, tools=[BASH_TOOL])
    assert policy.calls[1] == record["ids"][: record["turns"][1]["output_start"]]
    assert second.usage.input_tokens == len(policy.calls[1])


async def test_the_event_stream_is_anthropics_sequence(scripted: RunnerGateway, http: httpx.AsyncClient) -> None:
    opened = scripted.open()
    body = {
        "model": "m",
        "max_tokens": 512,
        "stream": True,
        "tools": [BASH],
        "messages": [{"role": "user", "content": "go"}],
    }
    r = await http.post(
        f"{opened['base_url']}/v1/messages?beta=true", json=body, headers={"x-api-key": opened["api_key"]}
    )
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.text
    events = _sse_events(r.text)
    assert [(kind, data["type"]) for kind, data in events] == [(kind, kind) for kind, _ in events]
    deltas = [data["delta"]["type"] for kind, data in events if kind == "content_block_delta"]
    assert [kind for kind, _ in events] == [
        "message_start",
        "ping",
        *["content_block_start", "content_block_delta", "content_block_delta", "content_block_stop"],
        *["content_block_start", "content_block_delta", "content_block_stop"] * 2,
        "message_delta",
        "message_stop",
    ]
    assert deltas == ["thinking_delta", "signature_delta", "text_delta", "input_json_delta"]
    start, delta = events[0][1]["message"], events[-2][1]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["output_tokens"] == 0
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == len(ByteTokenizer().encode(REPLIES[0])) + 1
    used = json.loads(next(d["delta"]["partial_json"] for _, d in events if d.get("delta", {}).get("partial_json")))
    assert used == {"command": "ls -la"}


async def test_a_rewritten_history_starts_a_new_segment(scripted: RunnerGateway) -> None:
    opened = scripted.open()
    async with _client(opened) as client:
        first = await client.messages.create(
            model="m", max_tokens=512, tools=[BASH], messages=[{"role": "user", "content": "list the files"}]
        )
        use = first.content[-1]
        assert use.type == "tool_use"
        result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "a.txt"}]}
        replayed = {"role": "assistant", "content": [block.model_dump() for block in first.content]}
        # The client compacts: it rewrites the first message before going on.
        rewritten = [{"role": "user", "content": "list the files (summary)"}, replayed, result]
        second = await client.messages.create(model="m", max_tokens=512, tools=[BASH], messages=rewritten)
    session = second.model_extra["session"] if second.model_extra else {}
    assert session["new_segment"] and "message 0" in session["segment_reason"] and session["segment"] == 1
    record = scripted.gateway.get(opened["id"]).record()
    assert record["segment_starts"] == [0, record["turns"][0]["output_end"]]


async def test_a_stop_sequence_or_max_tokens_ends_the_turn_and_a_replay_still_extends(scripted: RunnerGateway) -> None:
    opened = scripted.open()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    async with _client(opened) as client:
        first = await client.messages.create(model="m", max_tokens=512, messages=messages, stop_sequences=["Looking"])
        assert first.stop_reason == "stop_sequence" and first.stop_sequence == "Looking"
        # The text keeps the sequence, as the model's ids do: replayed, it is the turn the session recorded.
        assert first.content[-1].type == "text" and first.content[-1].text.endswith("Looking")
        messages += [{"role": "assistant", "content": [b.model_dump() for b in first.content]}]
        messages += [{"role": "user", "content": "more"}]
        second = await client.messages.create(model="m", max_tokens=3, messages=messages)
    assert second.stop_reason == "max_tokens" and second.usage.output_tokens == 3
    assert second.model_extra is not None and not second.model_extra["session"]["new_segment"]


async def test_count_tokens_is_the_rendered_prompts_length_and_touches_no_session(scripted: RunnerGateway) -> None:
    opened = scripted.open()
    request: dict[str, Any] = {"system": SYSTEM, "tools": [BASH], "messages": [{"role": "user", "content": "hi"}]}
    async with _client(opened) as client:
        counted = await client.messages.count_tokens(model="m", **request)
        assert scripted.gateway.get(opened["id"]).turns == []
        await client.messages.create(model="m", max_tokens=16, **request)
    assert counted.input_tokens == len(scripted.policy.calls[0])


REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"max_tokens": None}, "max_tokens"),
    ({"tool_choice": {"type": "any"}}, "tool_choice"),
    ({"tool_choice": {"type": "tool", "name": "bash"}}, "tool_choice"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools.0"),
    ({"top_k": 5}, "top_k"),
    ({"output_format": {"type": "json_schema", "schema": {}}}, "output_format"),
    ({"messages": []}, "messages is empty"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages.0.role"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages.0.content.0"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "Sure"}]}, "messages.1"),
    ({"system": [{"type": "document"}]}, "system.0"),
]


async def test_refusals_are_in_anthropics_shape_and_name_the_field(
    scripted: RunnerGateway, http: httpx.AsyncClient
) -> None:
    opened = scripted.open()
    base: dict[str, Any] = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "x"}]}
    url, key = f"{opened['base_url']}/v1/messages", {"x-api-key": opened["api_key"]}
    for change, word in REFUSED:
        body = {k: v for k, v in {**base, **change}.items() if v is not None}
        r = await http.post(url, json=body, headers=key)
        error = r.json()
        assert r.status_code == 400 and error["type"] == "error", (change, r.text)
        assert error["error"]["type"] == "invalid_request_error" and word in error["error"]["message"], (change, r.text)
    r = await http.post(f"{url}/batches", json=base, headers=key)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    assert scripted.gateway.get(opened["id"]).turns == []
    async with _client(opened) as client:
        with pytest.raises(anthropic.BadRequestError) as refused:
            await client.messages.create(
                model="m", max_tokens=16, messages=[{"role": "user", "content": "x"}], extra_body={"top_k": 5}
            )
    assert isinstance(refused.value.body, dict) and "top_k" in refused.value.body["error"]["message"]


async def test_the_sessions_token_budget_is_refused_in_anthropics_words(scripted: RunnerGateway) -> None:
    session = scripted.gateway.open(max_total_tokens=40)
    opened = {"base_url": f"{scripted.url}/v1/sessions/{session.id}", "api_key": session.key}
    async with _client(opened) as client:
        with pytest.raises(anthropic.BadRequestError) as refused:
            await client.messages.create(model="m", max_tokens=16, messages=[{"role": "user", "content": "x" * 60}])
    assert isinstance(refused.value.body, dict)
    assert re.match(r"prompt is too long: \d+ tokens > 40 maximum", refused.value.body["error"]["message"])
    assert session.stopped == "max_tokens"


async def test_the_session_key_is_taken_as_x_api_key_and_only_its_own(
    scripted: RunnerGateway, http: httpx.AsyncClient
) -> None:
    mine, other = scripted.open(), scripted.open()
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    url = f"{mine['base_url']}/v1/messages"
    for refused in ({"x-api-key": other["api_key"]}, {"x-api-key": "x" * 43}, {}):
        r = await http.post(url, json=body, headers=refused)
        assert r.status_code == 401, r.text
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == "authentication_error", r.text
    assert scripted.gateway.get(mine["id"]).turns == []
    assert (await http.post(url, json=body, headers={"x-api-key": mine["api_key"]})).status_code == 200
    # The package's typed error, with a wrong key; the key as a bearer token (ANTHROPIC_AUTH_TOKEN) is served.
    async with _client(mine, api_key="x" * 43) as client:
        with pytest.raises(anthropic.AuthenticationError):
            await client.messages.create(**body)
    async with _client(mine, api_key=None, auth_token=mine["api_key"]) as bearer:
        assert (await bearer.messages.create(**body)).stop_reason == "end_turn"
    assert len(scripted.gateway.get(mine["id"]).turns) == 2 and scripted.gateway.get(other["id"]).turns == []


async def test_the_guards_refusals_are_in_anthropics_shape_too(http: httpx.AsyncClient) -> None:
    """A body over the limit is refused before the app runs (sandrl's guard), and still said in Anthropic's shape."""
    gateway = Gateway(StopAware(REPLIES), model_name="m")
    with BackgroundServer(create_gateway_app(gateway, max_body_bytes=1000)) as server:
        session = gateway.open()
        body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x" * 2000}]}
        base = f"{server.url}/v1/sessions/{session.id}"
        r = await http.post(f"{base}/v1/messages", json=body, headers={"x-api-key": session.key})
        assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large", r.text
        assert "limit of 1000 bytes" in r.json()["error"]["message"]
        # The OpenAI routes keep sandrl's and OpenAI's shape.
        r = await http.post(f"{base}/chat/completions", json=body, headers={"x-api-key": session.key})
        assert r.status_code == 413 and "type" not in r.json() and r.json()["error_code"] == "payload_too_large"


async def test_x_api_key_opens_session_routes_only(http: httpx.AsyncClient) -> None:
    """On a server with a token, ``x-api-key`` is a session's header: the server's own routes still want the bearer."""
    token, key = "server-token-0123456789abcdef", "session-key-0123456789abcdef"
    app = FastAPI()

    @app.get("/v1/models")
    async def listed() -> dict[str, str]:
        return {"ok": "yes"}

    @app.get("/v1/sessions/{sid}/v1/models")
    async def session_listed(sid: str) -> dict[str, str]:
        return {"ok": sid}

    install_guards(
        app, token=token, key_of=lambda sid: key if sid == "s1" else None, max_body_bytes=MAX_BODY_BYTES, advice=""
    )
    with BackgroundServer(app) as server:
        assert (await http.get(f"{server.url}/v1/models", headers={"x-api-key": token})).status_code == 401
        assert (
            await http.get(f"{server.url}/v1/models", headers={"Authorization": f"Bearer {token}"})
        ).status_code == 200
        for sent in (key, token):
            r = await http.get(f"{server.url}/v1/sessions/s1/v1/models", headers={"x-api-key": sent})
            assert r.status_code == 200, r.text
        assert (await http.get(f"{server.url}/v1/sessions/s2/v1/models", headers={"x-api-key": key})).status_code == 401


async def test_the_inference_servers_sessions_serve_the_anthropic_client(served: Served) -> None:
    """``sandrl serve inference`` with the tiny model: streamed turns extend, the prefix cache shows in the usage."""
    async with httpx.AsyncClient() as http:
        opened = (await http.post(f"{served.url}/v1/sessions")).json()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
    async with _client(opened) as client:
        listed = await client.models.list()
        assert [m.id for m in listed.data] == ["tiny"]
        for turn in range(3):
            reply = await _turn(client, True, messages=messages, max_tokens=6, extra_body={"temperature": 0.0})
            assert reply.model_extra is not None and reply.model_extra["session"]["new_segment"] == (turn == 0)
            assert reply.stop_reason in ("end_turn", "max_tokens") and reply.usage.output_tokens <= 6
            if turn:
                assert reply.usage.cache_read_input_tokens > 0  # the session's earlier turns, from the prefix cache
            messages += [
                {"role": "assistant", "content": [b.model_dump() for b in reply.content]},
                {"role": "user", "content": f"again {turn}"},
            ]
    record = served.app.state.gateway.get(opened["id"]).record()
    assert record["segment_starts"] == [0] and len(record["turns"]) == 3
    last = record["turns"][-1]
    assert reply.usage.input_tokens + reply.usage.cache_read_input_tokens == last["context_tokens"]


THINKS = ("qwen3", "glm45")


@pytest.mark.parametrize("family", FAMILIES)
async def test_real_families_tool_turns_through_the_anthropic_client_are_token_exact(
    family: str, family_tokenizer_dir: Callable[[str], Path]
) -> None:
    """Each family's own template and parser: the thinking, text and tool_use blocks the gateway answers,
    replayed by the client with a tool result, extend the session; its ids are the template's rendering."""
    tok = model_tokenizer(family_tokenizer_dir(family))
    assert tok is not None
    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": {"command": "ls"}}}
    assistants: list[dict[str, Any]] = [
        {"role": "assistant", "content": "I will look.", "tool_calls": [call]},
        {"role": "assistant", "content": "Done."},
    ]
    if family in THINKS:
        for i, message in enumerate(assistants):
            message["reasoning_content"] = f"step {i}"
    chat = ChatFormat(tok, tools=[BASH_TOOL])
    policy = TemplateReplies(tok, [chat.reply_ids(m) for m in assistants])
    gateway = Gateway(policy, model_name=family)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the tests."}]
    request: dict[str, Any] = {"model": "m", "max_tokens": 256, "system": "You are an agent.", "tools": [BASH]}
    with BackgroundServer(create_gateway_app(gateway)) as server:
        session = gateway.open()
        async with _client({"base_url": f"{server.url}/v1/sessions/{session.id}", "api_key": session.key}) as client:
            first = await client.messages.create(messages=messages, **request)
            kinds = ["thinking"] if family in THINKS else []
            kinds += [] if family == "llama3.1" else ["text"]  # Llama 3.1's template writes a call alone
            assert [b.type for b in first.content] == [*kinds, "tool_use"], first.content
            use = first.content[-1]
            assert use.type == "tool_use" and use.name == "bash" and use.input == {"command": "ls"}
            result = {"type": "tool_result", "tool_use_id": use.id, "content": "a.py b.py"}
            messages += [
                {"role": "assistant", "content": [b.model_dump() for b in first.content]},
                {"role": "user", "content": [result]},
            ]
            second = await client.messages.create(messages=messages, **request)
    assert second.content[-1].type == "text" and second.content[-1].text == "Done."
    assert second.model_extra is not None and not second.model_extra["session"]["new_segment"]
    record = session.record()
    for turn, seen in zip(record["turns"], policy.calls, strict=True):
        assert seen == record["ids"][: turn["output_start"]]
    conversation = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "Fix the tests."},
        {**assistants[0], "tool_calls": [{**call, "id": use.id}]},
        {"role": "tool", "tool_call_id": use.id, "name": "bash", "content": "a.py b.py"},
        assistants[1],
    ]
    full = tok.encode_messages(conversation, tools=[BASH_TOOL])
    # The ends may differ by a token or two (see tests/rollout/test_chat_families_agent.py).
    common = min(len(full), len(record["ids"]))
    assert record["ids"][:common] == full[:common] and abs(len(full) - len(record["ids"])) <= 2
