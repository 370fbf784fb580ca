"""OpenAI Responses on a gateway session: ``POST {base_url}/responses`` (and ``{base_url}/v1/responses``).

What OpenAI Codex (``codex exec``) and the ``openai`` package's ``client.responses`` send: the
whole ``input`` each call with ``store: false`` (Codex), or ``previous_response_id`` and only the
new items. The request is read as chat messages and tools
(:mod:`sandrl.inference.gateway.responses_input`), the session runs one turn
(:meth:`~sandrl.inference.gateway.gateway.Gateway.turn`), and the reply is answered as OpenAI's
``response`` object:

- ``output``: a ``reasoning`` item when the model family thinks (its text as ``content``,
  ``encrypted_content`` null), a ``message`` item with the reply's text (always, when the reply
  has no call, so that a client replaying the output replays the turn), one ``function_call``
  item per parsed call, each with a ``call_id`` unique in the session;
- ``status`` ``completed``, or ``incomplete`` with ``incomplete_details.reason``
  ``max_output_tokens`` when the turn hit its token limit;
- ``usage``: ``input_tokens`` (the prompt the model saw: its segment so far),
  ``input_tokens_details.cached_tokens``, ``output_tokens``, ``output_tokens_details.reasoning_tokens``
  (0: the reply's ids are not split by part), ``total_tokens``; and sandrl's ``weight_version``
  and ``session`` as on chat completions.

``previous_response_id`` continues the session's latest response (its conversation, without its
``instructions``, which a call sends anew as OpenAI's do); an older or unknown id is refused by
name. ``stream: true`` answers OpenAI's event sequence (:mod:`sandrl.inference.gateway.responses_stream`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import Request, Response

from sandrl.inference.base import SamplingParams
from sandrl.inference.gateway.gateway import Gateway, gateway_of, harness_router
from sandrl.inference.gateway.responses_input import (
    RefusedField,
    ResponsesRequest,
    chat_messages,
    chat_tools,
    check_request,
)
from sandrl.inference.gateway.responses_stream import response_events
from sandrl.inference.gateway.session import Completion, Session


@harness_router.post("/{session_id}/responses", response_model=None)
@harness_router.post("/{session_id}/v1/responses", response_model=None)
async def responses(session_id: str, body: ResponsesRequest, request: Request) -> dict[str, Any] | Response:
    return await respond(gateway_of(request), session_id, body)


async def respond(gateway: Gateway, session_id: str, body: ResponsesRequest) -> dict[str, Any] | Response:
    """Answer one Responses call of a session: the ``response`` object, or its events with ``stream``."""
    entered = time.perf_counter()
    check_request(body)
    history = _history(gateway.get(session_id), body.previous_response_id)
    added = chat_messages(body.input, history=history)
    instructions = [{"role": "system", "content": body.instructions}] if body.instructions else []
    messages = [*instructions, *history, *added]
    if not messages:
        raise RefusedField("input", "is empty: send at least one input item (or instructions)")
    session, done = await gateway.turn(
        session_id,
        messages,
        chat_tools(body.tools),
        _params(body, gateway.reply_tokens(body.max_output_tokens)),
        parse_tools=body.tool_choice != "none",
    )
    response_id = f"resp_{uuid.uuid4().hex}"
    items = output_items(done.reply, incomplete=done.finish_reason == "length")
    session.last_response = (response_id, [*history, *added, *chat_messages(items)])
    answer = _response(gateway, body, session, done, response_id, items)
    answer["session"]["gateway_ms"] = gateway.account(done, entered)
    if body.stream:
        # The policy answers whole generations: the stream is the finished turn, as OpenAI's events.
        return Response(content=response_events(answer), media_type="text/event-stream")
    return answer


def _history(session: Session, previous: str | None) -> list[dict[str, Any]]:
    if previous is None:
        return []
    if session.last_response is None or session.last_response[0] != previous:
        raise RefusedField(
            "previous_response_id",
            f"{previous[:80]!r} is not this session's latest response: a session continues only its latest one "
            "(or send the whole input, as Codex does with store=false)",
        )
    return list(session.last_response[1])


def _params(body: ResponsesRequest, max_new_tokens: int) -> SamplingParams:
    return SamplingParams(
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        max_new_tokens=max_new_tokens,
        seed=body.seed,
    )


def output_items(reply: Mapping[str, Any], *, incomplete: bool = False) -> list[dict[str, Any]]:
    """The ``output`` items of a reply (an assistant chat message); see the module docstring."""
    status = "incomplete" if incomplete else "completed"
    items: list[dict[str, Any]] = []
    reasoning = reply.get("reasoning_content")
    if reasoning:
        items.append(
            {
                "id": f"rs_{uuid.uuid4().hex}",
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": reasoning}],
                "encrypted_content": None,
                "status": status,
            }
        )
    calls: Sequence[Mapping[str, Any]] = reply.get("tool_calls") or ()
    content = reply.get("content")
    if content or not calls:
        items.append(
            {
                "id": f"msg_{uuid.uuid4().hex}",
                "type": "message",
                "role": "assistant",
                "status": status,
                "content": [{"type": "output_text", "text": content or "", "annotations": [], "logprobs": []}],
            }
        )
    for call in calls:
        function = call["function"]
        items.append(
            {
                "id": f"fc_{uuid.uuid4().hex}",
                "type": "function_call",
                # Unique in the session: parsers number a reply's calls from 0, and a client pairs outputs by id.
                "call_id": f"call_{uuid.uuid4().hex[:24]}",
                "name": function["name"],
                "arguments": function["arguments"],
                "status": status,
            }
        )
    return items


def _response(
    gateway: Gateway,
    body: ResponsesRequest,
    session: Session,
    done: Completion,
    response_id: str,
    items: list[dict[str, Any]],
) -> dict[str, Any]:
    g = done.generation
    incomplete = done.finish_reason == "length"
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if incomplete else "completed",
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "model": body.model or gateway.model_name,
        "output": items,
        "parallel_tool_calls": True if body.parallel_tool_calls is None else body.parallel_tool_calls,
        "previous_response_id": body.previous_response_id,
        "reasoning": body.reasoning or {"effort": None, "summary": None},
        "store": bool(body.store),
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "text": body.text or {"format": {"type": "text"}},
        "tool_choice": body.tool_choice or "auto",
        "tools": body.tools or [],
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "truncation": "disabled",
        "metadata": body.metadata or {},
        "usage": {
            "input_tokens": len(done.prompt_ids),
            "input_tokens_details": {"cached_tokens": g.cached_tokens},
            "output_tokens": len(g.output_ids),
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": len(done.prompt_ids) + len(g.output_ids),
        },
        "weight_version": g.weight_version,
        "session": gateway.session_part(session, done),
    }
