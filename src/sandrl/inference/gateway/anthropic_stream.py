"""A finished Messages answer as Anthropic's server-sent events (``stream: true``).

The policy (:meth:`~sandrl.inference.base.InferenceClient.generate`) returns whole generations, and a
turn is parsed (tool calls, thinking) only once it is whole, so a streamed answer is the finished
turn sent as Anthropic's event sequence, all at once:
``message_start`` (the message without content, ``stop_reason`` null, the input usage), ``ping``,
then per content block ``content_block_start``, one delta (``thinking_delta`` then ``signature_delta``,
``text_delta``, or ``input_json_delta`` with the whole input's JSON) and ``content_block_stop``; then
``message_delta`` (``stop_reason``, ``stop_sequence`` and the usage) and ``message_stop``. The
``anthropic`` package's stream helpers and Claude Code accumulate it into the same message as the
answer without ``stream``. An error before the turn ends is an ordinary HTTP error, never an event.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
"""Headers of the event stream: no cache, no proxy buffering (Anthropic's own answers say the same)."""


def events(message: Mapping[str, Any]) -> bytes:
    """The whole event stream of the answer ``message`` (a Messages answer as the route renders it)."""
    return b"".join(_event(kind, data) for kind, data in _sequence(message))


def _sequence(message: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    usage = dict(message["usage"])
    empty: dict[str, Any] = {
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**usage, "output_tokens": 0},
    }
    start = {**message, **empty}
    yield "message_start", {"type": "message_start", "message": start}
    yield "ping", {"type": "ping"}
    for index, block in enumerate(message["content"]):
        kind = block["type"]
        if kind == "thinking":
            opened: dict[str, Any] = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [
                {"type": "thinking_delta", "thinking": block["thinking"]},
                {"type": "signature_delta", "signature": block["signature"]},
            ]
        elif kind == "tool_use":
            opened = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}]
        else:
            opened = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": block["text"]}]
        yield "content_block_start", {"type": "content_block_start", "index": index, "content_block": opened}
        for delta in deltas:
            yield "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    stopped = {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]}
    yield "message_delta", {"type": "message_delta", "delta": stopped, "usage": usage}
    yield "message_stop", {"type": "message_stop"}


def _event(kind: str, data: Mapping[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()
