"""A session's chat completion with ``stream: true``: the finished answer as OpenAI's chunks.

The session's policy returns whole generations, so a streamed answer is the finished turn sent as
OpenAI's ``chat.completion.chunk`` sequence (server-sent ``data:`` events, then ``data: [DONE]``),
made from the very answer ``stream: false`` gives, so the chunks assemble to it:

1. the role: ``delta {role: assistant, content: ""}`` (``content`` null when the reply is calls only);
2. ``delta {reasoning_content}`` when the model family thinks (vLLM's field);
3. ``delta {content}``: the reply's text;
4. per tool call, ``delta {tool_calls: [{index, id, type, function: {name, arguments: ""}}]}``, then
   its arguments in ``delta {tool_calls: [{index, function: {arguments}}]}``, as OpenAI streams them;
5. ``delta {}`` with the ``finish_reason``, the ``logprobs`` asked for, and sandrl's ``weight_version``
   and ``session`` (``token_ids`` with ``return_token_ids``, whose ``prompt_token_ids`` the first chunk has);
6. with ``stream_options.include_usage``, a chunk with no choices and the ``usage``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from fastapi import Response

from sandrl.errors import ConfigError
from sandrl.inference.routes_shared import sse

STREAM_OPTIONS = frozenset({"include_usage"})


def include_usage(stream: bool, options: Mapping[str, Any] | None) -> bool:
    """Whether ``stream_options`` asks for the usage chunk; options the gateway does not serve are refused."""
    if not options:
        return False
    if not stream:
        raise ConfigError("stream_options: needs stream=true")
    unknown = sorted(k for k, v in options.items() if k not in STREAM_OPTIONS and v)
    if unknown:
        raise ConfigError(f"stream_options: {unknown} are not served (only include_usage)")
    return bool(options.get("include_usage"))


def stream_response(answer: Mapping[str, Any], *, usage: bool) -> Response:
    """The chunks of ``answer`` (a ``chat.completion``) as one ``text/event-stream`` body."""
    body = b"".join(sse(chunk) for chunk in chunks(answer, usage=usage)) + b"data: [DONE]\n\n"
    return Response(content=body, media_type="text/event-stream")


def chunks(answer: Mapping[str, Any], *, usage: bool) -> Iterator[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of ``answer``; see the module docstring."""
    head = {
        "id": answer["id"],
        "object": "chat.completion.chunk",
        "created": answer["created"],
        "model": answer["model"],
    }
    choice = answer["choices"][0]
    message = choice["message"]
    calls = message.get("tool_calls") or []

    def delta(fields: dict[str, Any], **extra: Any) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": fields, "logprobs": None, "finish_reason": None}], **extra}

    first = {"role": "assistant", "content": "" if message.get("content") is not None else None}
    ids = {"prompt_token_ids": answer["prompt_token_ids"]} if "prompt_token_ids" in answer else {}
    yield delta(first, **ids)
    if message.get("reasoning_content"):
        yield delta({"reasoning_content": message["reasoning_content"]})
    if message.get("content"):
        yield delta({"content": message["content"]})
    for index, call in enumerate(calls):
        function = call["function"]
        opening = {"index": index, "id": call["id"], "type": "function"}
        yield delta({"tool_calls": [{**opening, "function": {"name": function["name"], "arguments": ""}}]})
        yield delta({"tool_calls": [{"index": index, "function": {"arguments": function["arguments"]}}]})
    last: dict[str, Any] = {
        "index": 0,
        "delta": {},
        "logprobs": choice.get("logprobs"),
        "finish_reason": choice["finish_reason"],
    }
    if "token_ids" in choice:
        last["token_ids"] = choice["token_ids"]
    yield {**head, "choices": [last], "weight_version": answer["weight_version"], "session": answer["session"]}
    if usage:
        yield {**head, "choices": [], "usage": answer["usage"]}
