"""A finished OpenAI Responses answer as the server-sent events OpenAI streams it with.

The session's policy returns whole generations, so a streamed answer is the finished turn sent as
OpenAI's event sequence, each event ``event: <type>`` then ``data: {...}`` with its
``sequence_number``:

``response.created`` and ``response.in_progress`` (the response, ``in_progress``, no output yet);
per output item ``response.output_item.added``, then for a message ``response.content_part.added``,
``response.output_text.delta`` (the whole text), ``response.output_text.done``,
``response.content_part.done``; for a reasoning item the same with ``response.reasoning_text.*``;
for a function call ``response.function_call_arguments.delta`` (the whole arguments) and
``.done``; then ``response.output_item.done`` with the item; last ``response.completed`` (or
``response.incomplete``) with the whole response and its usage. What the ``openai`` package's
``responses.stream`` accumulates and what Codex reads (it keeps the ``output_item.done`` items and
ends its turn on ``response.completed``).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from typing import Any


def response_events(response: Mapping[str, Any]) -> bytes:
    """The events of ``response`` (a finished ``response`` object), framed, in one body."""
    out: list[bytes] = []
    numbers = itertools.count()

    def emit(kind: str, **fields: Any) -> None:
        payload = {"type": kind, "sequence_number": next(numbers), **fields}
        out.append(f"event: {kind}\ndata: ".encode() + json.dumps(payload).encode() + b"\n\n")

    pending = {**response, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    emit("response.created", response=pending)
    emit("response.in_progress", response=pending)
    for index, item in enumerate(response["output"]):
        where = {"item_id": item["id"], "output_index": index}
        kind = item["type"]
        if kind == "function_call":
            emit(
                "response.output_item.added",
                output_index=index,
                item={**item, "arguments": "", "status": "in_progress"},
            )
            emit("response.function_call_arguments.delta", **where, delta=item["arguments"])
            emit("response.function_call_arguments.done", **where, name=item["name"], arguments=item["arguments"])
        else:
            parts = item["content"]
            emit(
                "response.output_item.added", output_index=index, item={**item, "content": [], "status": "in_progress"}
            )
            text_events = "response.output_text" if kind == "message" else "response.reasoning_text"
            logprobs: dict[str, list[Any]] = {"logprobs": []} if kind == "message" else {}
            for c, part in enumerate(parts):
                emit("response.content_part.added", **where, content_index=c, part={**part, "text": ""})
                emit(f"{text_events}.delta", **where, content_index=c, delta=part["text"], **logprobs)
                emit(f"{text_events}.done", **where, content_index=c, text=part["text"], **logprobs)
                emit("response.content_part.done", **where, content_index=c, part=part)
        emit("response.output_item.done", output_index=index, item=item)
    emit("response.incomplete" if response["status"] == "incomplete" else "response.completed", response=response)
    return b"".join(out)
