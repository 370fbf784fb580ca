"""A session's Anthropic routes: what the ``anthropic`` package and Claude Code call, under ``{base_url}/v1/``.

A client takes the session's ``base_url`` as its base URL (``ANTHROPIC_BASE_URL``) and its key as
``x-api-key`` (``ANTHROPIC_API_KEY``) or ``Authorization: Bearer`` (``ANTHROPIC_AUTH_TOKEN``). Queries
(Claude Code's ``?beta=true``) and headers (``anthropic-version``, ``anthropic-beta``) change nothing.

- ``POST {base_url}/v1/messages``: one model turn of the session, token-exact under its rules
  (:mod:`~sandrl.inference.gateway.session`), translated both ways by
  :mod:`~sandrl.inference.gateway.anthropic_messages`. Served: ``system``, text / ``tool_use`` /
  ``tool_result`` / ``thinking`` blocks, custom ``tools``, ``tool_choice`` ``auto`` and ``none``
  (``disable_parallel_tool_use`` is read past: nothing can forbid a second call), ``max_tokens``
  (required, as Anthropic requires it), ``stop_sequences`` (the text keeps the sequence, as the
  model's ids do, so that a replay extends), ``temperature``, ``top_p``, ``stream``
  (:mod:`~sandrl.inference.gateway.anthropic_stream`); ``metadata``, ``thinking`` (a family that
  thinks answers ``thinking`` blocks whatever it says; its budget is not enforced beyond
  ``max_tokens``), ``context_management``, ``service_tier`` and other labels are accepted and change
  nothing. The answer has ``stop_reason`` (``end_turn``, ``max_tokens``, ``stop_sequence``,
  ``tool_use``), ``usage`` (``cache_read_input_tokens``: the prompt's tokens the engine took from its
  prefix cache) and, as the chat route's, ``weight_version`` and ``session``. Refused (400, naming the
  field): ``tool_choice`` ``any`` or ``tool`` and structured outputs (``output_format``,
  ``output_config.format``), which need constrained decoding; ``top_k`` (the sampler has none);
  ``mcp_servers``; Anthropic's server tools; non-text blocks. A call over the session's token budget is
  refused in Anthropic's words, ``prompt is too long: N tokens > M maximum``, which Claude Code answers by
  compacting its history (a new segment).
- ``POST {base_url}/v1/messages/count_tokens`` → ``{"input_tokens"}``: the length of the request's
  rendering as a new segment would render it (the session is not touched); Claude Code calls it.
- ``GET {base_url}/v1/models`` is the gateway's (:mod:`~sandrl.inference.gateway.gateway`): one list in
  OpenAI's and Anthropic's shapes at once (Claude Code lists a gateway's models when
  ``CLAUDE_CODE_ENABLE_GATEWAY_MODEL_DISCOVERY`` is set). The model name of a request is not checked, as
  on the chat route: a session belongs to one policy; the answer names the model the request named.

Errors on these routes are in Anthropic's shape (:mod:`sandrl.inference.http_errors`).
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

from fastapi import Request, Response

from sandrl.errors import ConfigError
from sandrl.inference.base import SamplingParams
from sandrl.inference.gateway.anthropic_messages import (
    CountTokensRequest,
    MessagesRequest,
    chat_request,
    content_blocks,
    stop_reason,
    usage,
)
from sandrl.inference.gateway.anthropic_stream import SSE_HEADERS, events
from sandrl.inference.gateway.gateway import gateway_of, harness_router

_OVER_BUDGET = re.compile(r"maximum context length is (\d+) tokens.*has (\d+)\.")


@harness_router.post("/{session_id}/v1/messages", response_model=None)
async def messages(session_id: str, body: MessagesRequest, request: Request) -> dict[str, Any] | Response:
    gateway = gateway_of(request)
    entered = time.perf_counter()
    params = _params(body)
    chat_messages, tools, parse_tools = chat_request(body)
    try:
        session, done = await gateway.turn(session_id, chat_messages, tools, params, parse_tools=parse_tools)
    except ConfigError as exc:
        said = _in_anthropic_words(exc)
        if said is exc:
            raise
        raise said from exc
    reason, sequence = stop_reason(done, body.stop_sequences or ())
    message: dict[str, Any] = {
        "id": f"msg_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": body.model or gateway.model_name,
        "content": content_blocks(done),
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage(done),
        "weight_version": done.generation.weight_version,
        "session": gateway.session_part(session, done),
    }
    message["session"]["gateway_ms"] = gateway.account(done, entered)
    if body.stream:
        return Response(events(message), media_type="text/event-stream", headers=SSE_HEADERS)
    return message


@harness_router.post("/{session_id}/v1/messages/count_tokens")
async def count_tokens(session_id: str, body: CountTokensRequest, request: Request) -> dict[str, int]:
    gateway = gateway_of(request)
    gateway.get(session_id)
    chat_messages, tools, _ = chat_request(body)
    return {"input_tokens": len(gateway.chat(tools).prompt_ids(chat_messages))}


def _params(body: MessagesRequest) -> SamplingParams:
    if body.top_k is not None:
        raise ConfigError(f"top_k={body.top_k} is not served (the sampler has no top-k): leave it out")
    if body.mcp_servers:
        raise ConfigError("mcp_servers is not served (the gateway connects to no MCP server): leave it out")
    if body.output_format is not None or (body.output_config or {}).get("format") is not None:
        raise ConfigError(
            "structured outputs (output_format, output_config.format) are not served: they need constrained "
            "decoding; leave them out"
        )
    if body.max_tokens < 1:
        raise ConfigError(f"max_tokens must be >= 1, got {body.max_tokens}")
    return SamplingParams(
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        max_new_tokens=body.max_tokens,
        stop=tuple(body.stop_sequences or ()),
    )


def _in_anthropic_words(exc: ConfigError) -> ConfigError:
    """A refusal for the session's token budget, in the words Anthropic's API says it in (Claude Code compacts
    its history on them); any other refusal as it is."""
    over = _OVER_BUDGET.search(exc.message) if exc.error_code == "context_length_exceeded" else None
    if over is None:
        return exc
    limit, length = over.groups()
    words = f"prompt is too long: {length} tokens > {limit} maximum ({exc.message})"
    return ConfigError(words, error_code=exc.error_code)
