"""OpenAI Responses on a gateway session, through the official ``openai`` package and as ``codex exec`` sends it:
function tools over several turns, token-exact records, a rewritten history's new segment, refusals by name."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from sandrl.inference.gateway import Gateway, create_gateway_app
from sandrl.inference.gateway.responses_input import chat_messages
from sandrl.inference.gateway.session import normalize
from sandrl.inference.server import BackgroundServer
from sandrl.inference.tokenizer import ByteTokenizer

from ..chat_families import BASH_TOOL
from .conftest import Served
from .test_gateway import RunnerGateway, ScriptedReplies, _record, _session


def _call(command: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "bash", "arguments": {"command": command}}) + "\n</tool_call>"


REPLIES = [
    f"<think>I should look first.</think>Looking.\n{_call('ls')}",
    _call("cat a.txt"),  # calls only: no message item
    "Done: a.txt says hi.",
]
FUNCTION_TOOL = {
    "type": "function",
    "name": "bash",
    "description": "Run a command.",
    "parameters": BASH_TOOL["function"]["parameters"],
    "strict": False,
}
INSTRUCTIONS = "You are a coding agent."
OPENING: list[dict[str, Any]] = [
    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Sandbox: workspace-write."}]},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What does a.txt say?"}]},
]


@pytest.fixture
def responses_gateway() -> Iterator[RunnerGateway]:
    policy = ScriptedReplies(REPLIES)
    gateway = Gateway(policy, model_name="scripted")  # type: ignore[arg-type]
    with BackgroundServer(create_gateway_app(gateway)) as server:
        yield RunnerGateway(gateway, server.url, policy)


def _replayed(output: list[Any], results: dict[str, str]) -> list[dict[str, Any]]:
    """What a client sends back after a response: its output items, then each call's output."""
    items = [item.model_dump(exclude_none=True) for item in output]
    for item in output:
        if item.type == "function_call":
            items.append({"type": "function_call_output", "call_id": item.call_id, "output": results[item.name]})
    return items


def _conversation(tool_results: list[str]) -> list[dict[str, Any]]:
    """The scripted conversation as chat messages, for the byte template to render."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "system", "content": "Sandbox: workspace-write."},
        {"role": "user", "content": "What does a.txt say?"},
    ]
    for reply, result in zip(REPLIES, [*tool_results, None], strict=True):
        messages.append({"role": "assistant", "content": reply})
        if result is not None:
            messages.append({"role": "tool", "content": result})
    return messages


async def test_a_tool_using_session_over_create_stream_and_events_is_one_token_exact_segment(
    responses_gateway: RunnerGateway, tokenizer: ByteTokenizer
) -> None:
    policy = responses_gateway.policy
    opened = responses_gateway.open()
    common: dict[str, Any] = {
        "model": "gpt-5-codex",
        "instructions": INSTRUCTIONS,
        "tools": [FUNCTION_TOOL],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "thread-1",
        "reasoning": {"effort": "medium", "summary": "auto"},
    }
    items = list(OPENING)
    async with openai.AsyncOpenAI(base_url=opened["base_url"], api_key=opened["api_key"], max_retries=0) as client:
        first: Any = await client.responses.create(input=items, **common)
        assert [o.type for o in first.output] == ["reasoning", "message", "function_call"]
        assert first.output[0].content[0].text == "I should look first." and first.output_text == "Looking."
        assert json.loads(first.output[2].arguments) == {"command": "ls"} and first.status == "completed"
        assert first.usage.input_tokens == len(policy.calls[0])
        assert first.usage.output_tokens == len(tokenizer.encode(REPLIES[0])) + 1
        assert first.session["new_segment"]
        items += _replayed(first.output, {"bash": "a.txt"})

        async with client.responses.stream(input=items, **common) as stream:
            kinds = [event.type async for event in stream]
            second: Any = await stream.get_final_response()
        assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
        assert "response.function_call_arguments.delta" in kinds
        assert [o.type for o in second.output] == ["function_call"] and not second.session["new_segment"]
        assert second.output[0].call_id != first.output[2].call_id  # unique in the session
        items += _replayed(second.output, {"bash": "hi"})

        events = await client.responses.create(input=items, stream=True, **common)
        final: Any = None
        async for event in events:
            if event.type == "response.completed":
                final = event.response
        assert final is not None and final.output_text == REPLIES[2] and not final.session["new_segment"]
    record = responses_gateway.gateway.get(opened["id"]).record()
    assert record["segment_starts"] == [0] and len(record["turns"]) == 3
    # Token in, token out: the record is the byte template's rendering of the conversation, the model's
    # own ids kept, and each call's prompt was exactly the record up to its output.
    chat_tool = {"type": "function", "function": {k: FUNCTION_TOOL[k] for k in ("name", "description", "parameters")}}
    assert record["ids"] == tokenizer.encode_messages(_conversation(["a.txt", "hi"]), tools=[chat_tool])
    for prompt, turn in zip(policy.calls, record["turns"], strict=True):
        assert prompt == record["ids"][: turn["output_start"]]
    assert sum(record["loss_mask"]) == sum(len(tokenizer.encode(r)) + 1 for r in REPLIES)


async def test_codex_exec_wire_format_over_the_v1_path(responses_gateway: RunnerGateway) -> None:
    """The body and the SSE reading of ``codex exec`` 0.171.0 (recorded against this route): ``store: false``,
    its prompt as developer messages and no ``instructions``, the whole input each time, the items it keeps from
    ``response.output_item.done`` sent back, ``POST {base_url}/v1/responses``."""
    opened = responses_gateway.open()
    body: dict[str, Any] = {
        "model": "tiny",
        "stream": True,
        "input": [{"id": "msg_56bce7b8", **OPENING[0]}, OPENING[1]],
        "tools": [FUNCTION_TOOL],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {},
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "01a24fb6-82e7-7352-abc3-ef103234d113",
        "client_metadata": {"session_id": "01a24fb6-82e7-7352-abc3-ef103234d113", "turn_id": "01a24fb6-4c07"},
    }
    headers = {"Authorization": f"Bearer {opened['api_key']}"}
    async with httpx.AsyncClient(headers=headers, timeout=30) as http:
        for turn, result in enumerate(["a.txt", "hi", None]):
            r = await http.post(f"{opened['base_url']}/v1/responses", json=body)
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.text
            events = [json.loads(line[len("data: ") :]) for line in r.text.splitlines() if line.startswith("data: ")]
            assert [e["sequence_number"] for e in events] == list(range(len(events)))
            done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
            completed = events[-1]
            assert completed["type"] == "response.completed" and completed["response"]["output"] == done
            assert completed["response"]["usage"]["output_tokens"] > 0
            assert completed["response"]["session"]["new_segment"] == (turn == 0)
            if result is None:
                assert done[-1]["content"][0]["text"] == REPLIES[2]
                break
            # 0.171.0 sends the items back whole; older versions drop their ids (as the second turn does here).
            kept = [{k: v for k, v in item.items() if turn == 0 or k not in ("id", "status")} for item in done]
            calls = [item for item in kept if item["type"] == "function_call"]
            body["input"] += kept + [
                {"type": "function_call_output", "id": f"fco_{turn}", "call_id": c["call_id"], "output": result}
                for c in calls
            ]
    record = responses_gateway.gateway.get(opened["id"]).record()
    assert record["segment_starts"] == [0] and len(record["turns"]) == 3


async def test_a_rewritten_history_starts_a_segment_and_previous_response_id_continues(
    responses_gateway: RunnerGateway,
) -> None:
    opened = responses_gateway.open()
    async with openai.AsyncOpenAI(base_url=opened["base_url"], api_key=opened["api_key"], max_retries=0) as client:
        first: Any = await client.responses.create(
            model="m",
            instructions=INSTRUCTIONS,
            input=OPENING,
            tools=[FUNCTION_TOOL],  # type: ignore[arg-type,list-item]
        )
        call = first.output[2]
        # Only the new item, after the previous response: the session continues it.
        second: Any = await client.responses.create(
            model="m",
            instructions=INSTRUCTIONS,
            previous_response_id=first.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "a.txt"}],
            tools=[FUNCTION_TOOL],  # type: ignore[list-item]
        )
        assert not second.session["new_segment"] and second.previous_response_id == first.id
        with pytest.raises(openai.BadRequestError, match="previous_response_id"):
            await client.responses.create(model="m", previous_response_id=first.id, input="again")
        # The client summarises the task: the rewritten user message starts a segment, recorded with its reason.
        rewritten = [OPENING[0], {"role": "user", "content": "Summary: read a.txt."}]
        rewritten += _replayed(first.output, {"bash": "a.txt"}) + _replayed(second.output, {"bash": "hi"})
        third: Any = await client.responses.create(
            model="m",
            instructions=INSTRUCTIONS,
            input=rewritten,  # type: ignore[arg-type]
            tools=[FUNCTION_TOOL],  # type: ignore[list-item]
        )
    assert third.session["new_segment"] and "message 2 (user) differs" in third.session["segment_reason"]
    record = responses_gateway.gateway.get(opened["id"]).record()
    start = record["segment_starts"][1]
    assert record["segment_starts"] == [0, start] and start == record["turns"][1]["output_end"]
    assert not any(record["loss_mask"][start : record["turns"][2]["output_start"]])


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": [FUNCTION_TOOL], "tool_choice": "required"}, "tool_choice"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0].type",
        ),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
        ({"input": [{"type": "local_shell_call", "call_id": "c"}]}, "input[0].type"),
        ({"background": True}, "background"),
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {}}}}, "text.format"),
        ({"truncation": "auto"}, "truncation"),
        ({"include": ["file_search_call.results"]}, "include"),
        ({"previous_response_id": "resp_nope"}, "previous_response_id"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"input": []}, "input"),
    ],
)
def test_what_a_session_cannot_honour_is_refused_naming_the_field(
    responses_gateway: RunnerGateway, extra: dict[str, Any], field: str
) -> None:
    opened = responses_gateway.open()
    body: dict[str, Any] = {"model": "m", "input": "hi", **extra}
    # Closed here: left to the collector, its connection was an unclosed socket's ResourceWarning in a later test.
    with (
        openai.OpenAI(base_url=opened["base_url"], api_key=opened["api_key"], max_retries=0) as client,
        pytest.raises(openai.BadRequestError) as refused,
    ):
        client.responses.create(**body)
    error = refused.value
    assert error.status_code == 400 and isinstance(error.body, dict), error.message
    assert error.body["message"].startswith(f"{field}: "), error.body
    assert error.body["type"] == "invalid_request_error" and error.param == field  # OpenAI's error.param
    assert not responses_gateway.policy.calls  # refused before the policy ran


async def test_responses_on_sandrl_serve_inference_with_the_tiny_model(served: Served) -> None:
    """The route on the inference server's sessions too; a turn cut at max_output_tokens is ``incomplete``."""
    opened = await _session(served.url)
    async with openai.AsyncOpenAI(base_url=opened["base_url"], api_key=opened["api_key"], max_retries=0) as client:
        r: Any = await client.responses.create(
            model="tiny", input="Say something.", max_output_tokens=4, extra_body={"seed": 3}
        )
    record = await _record(served.url, opened)
    turn = record["turns"][0]
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == turn["output_end"] - turn["output_start"] == 4
    assert r.usage.input_tokens == turn["context_tokens"] and r.output[0].type == "message"


def test_the_models_items_of_one_turn_read_back_as_one_assistant_message() -> None:
    """What the session's matcher compares stays the same whether a client replays reasoning items, drops them,
    or sends a turn's calls without its text; anything else keeps its place."""
    call = {"type": "function_call", "call_id": "call_a", "name": "bash", "arguments": '{"command": "ls"}'}
    message = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]}
    reasoning = {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "plan"}]}
    result = {"type": "function_call_output", "call_id": "call_a", "output": [{"type": "input_text", "text": "a"}]}
    user = {"role": "user", "content": "go"}
    full = chat_messages([user, reasoning, message, call, result])
    assert full == [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": "Looking.",
            "reasoning_content": "plan",
            "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "bash", "arguments": call["arguments"]}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "a", "name": "bash"},
    ]
    dropped = chat_messages([user, message, call, result])
    assert [normalize(m) for m in dropped] == [normalize(m) for m in full]
    calls_only = chat_messages([user, call, result])
    assert calls_only[1]["content"] is None and normalize(calls_only[1])[2] == normalize(full[1])[2]
    # Two assistant messages in a row stay two (a client's own history, not one turn's output).
    assert len(chat_messages([user, message, message])) == 3
