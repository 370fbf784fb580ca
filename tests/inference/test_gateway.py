"""The session gateway: the official ``openai`` client with tools, token-exact sessions, new segments."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import pytest

from sandrl.inference.base import Generation, SamplingParams
from sandrl.inference.gateway import Gateway, create_gateway_app
from sandrl.inference.server import BackgroundServer
from sandrl.inference.tokenizer import ByteTokenizer

from ..chat_families import BASH_TOOL
from .conftest import Served


async def _session(url: str) -> dict[str, Any]:
    """A session opened on ``sandrl serve inference`` (its route is open to loopback callers of a server without
    a token): ``{"id", "base_url", "api_key"}``."""
    async with httpx.AsyncClient() as http:
        r = await http.post(f"{url}/v1/sessions")
        assert r.status_code == 200, r.text
        return dict(r.json())


def _key(opened: dict[str, Any]) -> dict[str, str]:
    return {"Authorization": f"Bearer {opened['api_key']}"}


async def _record(url: str, opened: dict[str, Any]) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:
        r = await http.get(f"{url}/v1/sessions/{opened['id']}", headers=_key(opened))
        assert r.status_code == 200, r.text
        return dict(r.json())


async def test_a_session_extends_its_ids_turn_by_turn(served: Served, tokenizer: ByteTokenizer) -> None:
    opened = await _session(served.url)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    prompts: list[list[int]] = []
    async with openai.AsyncOpenAI(base_url=opened["base_url"], api_key=opened["api_key"], max_retries=0) as client:
        for turn in range(3):
            r = await client.chat.completions.create(
                model="tiny",
                messages=messages,  # type: ignore[arg-type]
                max_tokens=12,
                seed=turn,
                logprobs=True,
                extra_body={"return_token_ids": True},
            )
            answer: Any = r
            prompts.append(answer.prompt_token_ids)
            assert answer.session["new_segment"] == (turn == 0) and answer.session["segment"] == 0
            messages += [
                r.choices[0].message.model_dump(exclude_none=True),
                {"role": "user", "content": f"again {turn}"},
            ]
    record = await _record(served.url, opened)
    ids, mask = record["ids"], record["loss_mask"]
    assert record["segment_starts"] == [0] and len(record["turns"]) == 3
    for seen, turn in zip(prompts, record["turns"], strict=True):
        assert seen == ids[: turn["output_start"]]  # the engine's input was exactly the recorded prefix
        assert all(mask[turn["output_start"] : turn["output_end"]])
    assert sum(mask) == sum(t["output_end"] - t["output_start"] for t in record["turns"])
    # Token in, token out: turn 2's ids are turn 1's prompt and output, then only the new user message.
    first, second = record["turns"][0], record["turns"][1]
    appended = ids[first["output_end"] : second["output_start"]]
    closed = ids[first["output_end"] - 1] in tokenizer.eos_token_ids
    expected = ([] if closed else [tokenizer.im_end_id]) + tokenizer.encode_turn("user", "again 0")
    assert appended == expected + tokenizer.assistant_prefix_ids()
    async with httpx.AsyncClient(headers=_key(opened)) as http:
        assert (await http.delete(f"{served.url}/v1/sessions/{opened['id']}")).status_code == 200
        gone = await http.get(f"{served.url}/v1/sessions/{opened['id']}")
        assert gone.status_code == 401  # its key went with it


async def test_a_rewritten_history_starts_a_new_segment(served: Served) -> None:
    opened = await _session(served.url)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "first"}]
    async with openai.AsyncOpenAI(base_url=opened["base_url"], api_key=opened["api_key"], max_retries=0) as client:
        r = await client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, seed=1)  # type: ignore[arg-type]
        reply = r.choices[0].message.model_dump(exclude_none=True)
        # The harness summarises: it rewrites the first message before going on.
        rewritten = [{"role": "user", "content": "first (summarised)"}, reply, {"role": "user", "content": "next"}]
        r2: Any = await client.chat.completions.create(model="tiny", messages=rewritten, max_tokens=6, seed=2)  # type: ignore[arg-type]
    assert r2.session["new_segment"] and "message 0" in r2.session["segment_reason"]
    record = await _record(served.url, opened)
    start = record["segment_starts"][1]
    assert record["segment_starts"] == [0, start] and start == record["turns"][0]["output_end"]
    second = record["turns"][1]
    assert second["new_segment"] and second["context_tokens"] == second["output_start"] - start
    assert not any(record["loss_mask"][start : second["output_start"]])


@dataclass
class ScriptedReplies:
    """An InferenceClient answering with given texts (the byte tokenizer's ids and <|im_end|>)."""

    replies: Sequence[str]
    calls: list[list[int]] = field(default_factory=list)
    tokenizer: ByteTokenizer = field(default_factory=ByteTokenizer)
    max_context: int | None = 4096

    async def generate(self, input_ids: list[int], params: SamplingParams) -> Generation:
        text = self.replies[min(len(self.calls), len(self.replies) - 1)]
        self.calls.append(list(input_ids))
        ids = [*self.tokenizer.encode(text), self.tokenizer.im_end_id]
        return Generation(ids, [-0.25] * len(ids), "stop", 0, len(input_ids))

    async def update_weights(self, path: str, *, version: int | None = None) -> int:
        raise NotImplementedError

    async def health(self) -> None:
        return None


@dataclass
class RunnerGateway:
    """The runner's gateway (:func:`create_gateway_app`) on a loopback port, its sessions opened in-process."""

    gateway: Gateway
    url: str
    policy: ScriptedReplies

    def open(self) -> dict[str, Any]:
        """A session as the runner hands it to a harness: ``{"id", "base_url", "api_key"}``."""
        session = self.gateway.open()
        return {"id": session.id, "base_url": f"{self.url}/v1/sessions/{session.id}", "api_key": session.key}


@pytest.fixture
async def scripted_gateway() -> AsyncIterator[RunnerGateway]:
    call = json.dumps({"name": "bash", "arguments": {"command": "ls -la"}})
    policy = ScriptedReplies([f"Looking.\n<tool_call>\n{call}\n</tool_call>", "Done."])
    gateway = Gateway(policy, model_name="scripted")  # type: ignore[arg-type]
    with BackgroundServer(create_gateway_app(gateway)) as server:
        yield RunnerGateway(gateway, server.url, policy)


async def test_tool_calls_through_the_openai_client(scripted_gateway: RunnerGateway, tokenizer: ByteTokenizer) -> None:
    policy = scripted_gateway.policy
    opened = scripted_gateway.open()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "list the files"}]
    async with openai.AsyncOpenAI(base_url=opened["base_url"], api_key=opened["api_key"], max_retries=0) as client:
        r = await client.chat.completions.create(model="any", messages=messages, tools=[BASH_TOOL], tool_choice="auto")  # type: ignore[arg-type,list-item]
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content == "Looking."
        calls = choice.message.tool_calls
        assert calls is not None and len(calls) == 1
        call: Any = calls[0]
        assert call.function.name == "bash" and json.loads(call.function.arguments) == {"command": "ls -la"}
        messages += [
            choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "a.txt\nb.txt"},
        ]
        r2: Any = await client.chat.completions.create(model="any", messages=messages, tools=[BASH_TOOL])  # type: ignore[arg-type,list-item]
        assert r2.choices[0].message.content == "Done." and not r2.session["new_segment"]
        assert r2.usage.completion_tokens == len("Done.") + 1
    record = scripted_gateway.gateway.get(opened["id"]).record()
    # The whole session is the byte template's rendering of the conversation with its tools.
    conversation = [
        {"role": "user", "content": "list the files"},
        {"role": "assistant", "content": policy.replies[0]},
        {"role": "tool", "content": "a.txt\nb.txt"},
        {"role": "assistant", "content": "Done."},
    ]
    assert record["ids"] == tokenizer.encode_messages(conversation, tools=[BASH_TOOL])
    assert policy.calls[1] == record["ids"][: record["turns"][1]["output_start"]]


async def test_requests_the_gateway_cannot_serve_are_refused_by_name(scripted_gateway: RunnerGateway) -> None:
    opened = scripted_gateway.open()
    base = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    async with httpx.AsyncClient(headers=_key(opened)) as http:
        for extra, word in (
            ({"stream_options": {"include_usage": True}}, "stream_options: needs stream=true"),
            ({"n": 2}, "n must be 1"),
            ({"tool_choice": "required"}, "tool_choice"),
            ({"messages": []}, "messages is empty"),
        ):
            r = await http.post(f"{opened['base_url']}/chat/completions", json={**base, **extra})
            assert r.status_code == 400 and word in r.json()["message"], r.text
        r = await http.post(f"{scripted_gateway.url}/v1/sessions/sess-nope/chat/completions", json=base)
        assert r.status_code == 401 and r.json()["error_code"] == "unauthorized"  # no session, so no key opens it


def test_idle_sessions_are_forgotten_when_another_opens() -> None:
    gateway = Gateway(ScriptedReplies(["x"]), model_name="m", idle_ttl_s=0.0)  # type: ignore[arg-type]
    first = gateway.open()
    second = gateway.open()
    assert first.id not in gateway.sessions and second.id in gateway.sessions


async def test_a_retried_call_after_a_failure_extends_the_same_ids() -> None:
    """A client that retries a call the policy failed (the Anthropic SDK and Claude Code retry 5xx) sends the same
    messages again: the retry's prompt is the first try's, not one that holds the failed prompt twice."""
    from sandrl.errors import InferenceError

    class FailsOnce(ScriptedReplies):
        failed: list[int] | None = None

        async def generate(self, input_ids: list[int], params: SamplingParams) -> Generation:
            if len(self.calls) == 1 and self.failed is None:
                self.failed = list(input_ids)
                raise InferenceError("the engine went away")
            return await super().generate(input_ids, params)

    policy = FailsOnce(["Hello.", "Again."])
    gateway = Gateway(policy, model_name="scripted")  # type: ignore[arg-type]
    session = gateway.open()
    history: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
    params = SamplingParams(max_new_tokens=8)
    _, first = await gateway.turn(session.id, history, None, params)
    history += [first.reply, {"role": "user", "content": "more"}]
    with pytest.raises(InferenceError):
        await gateway.turn(session.id, history, None, params)
    before = list(session.ids)
    _, retried = await gateway.turn(session.id, history, None, params)
    assert not retried.turn.new_segment
    assert policy.calls[1] == policy.failed == retried.prompt_ids  # what the failed try would have seen
    assert retried.prompt_ids[: len(before)] == before and len(retried.prompt_ids) < 2 * len(before)
    assert len(session.segment_starts) == 1 and session.ids[len(retried.prompt_ids) :] == retried.generation.output_ids
