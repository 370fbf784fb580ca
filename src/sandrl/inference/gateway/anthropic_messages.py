"""Anthropic's Messages API in a session's terms: the request as chat messages and tools, the turn as a message.

What :mod:`~sandrl.inference.gateway.anthropic_routes` serves is translated both ways here, so that a
client replaying the model's own output extends the session token for token:

- **In**: ``system`` (a string or text blocks) becomes the first message; each user message's blocks
  become, in order, a user message per run of text blocks and a tool message per ``tool_result``
  (its ``tool_use_id`` as ``tool_call_id``, the tool's name when an earlier ``tool_use`` gives it);
  an assistant message becomes one message with its text, its ``tool_use`` blocks as tool calls
  (``input`` as the arguments) and its ``thinking`` as ``reasoning_content``. Text blocks are joined
  with a blank line (:data:`JOIN`); ``cache_control`` and ``citations`` are read past (the gateway's
  prefix cache needs no markers). Claude Code's attribution block (a system block starting
  ``x-anthropic-billing-header:``, which carries a hash that changes between conversations and is no
  instruction to the model) is dropped, as vLLM's Anthropic route drops it. Custom tools
  (``input_schema``) become functions; a tool with another ``type`` (Anthropic's server and built-in
  tools: web search, code execution, bash_2025...) is refused by name, since nothing here runs tools.
- **Out**: the reply is a ``thinking`` block (what the model family's parser found between its think
  tags; ``signature`` empty, since nothing here signs), a ``text`` block, then a ``tool_use`` block per
  call, with an id of its own (``toolu_...``, unique in the session: the parsers number calls per reply,
  and Claude Code keys its tool state by id). Replayed as they came, these blocks are the message the
  session recorded (ids are not compared), so the next call extends it.

Refused, naming the field: image, document and other non-text blocks, ``redacted_thinking``, a final
assistant message (prefill: the model always starts its own turn here), roles other than user and
assistant, and an empty user message.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from sandrl.errors import ConfigError
from sandrl.inference.gateway.session import Completion, call_parts

JOIN = "\n\n"
"""Between the text blocks of one message (Anthropic's API keeps blocks apart; a chat message is one text)."""
ATTRIBUTION = "x-anthropic-billing-header:"
"""How Claude Code's attribution block in ``system`` starts (see the module docstring)."""


class MessageParam(BaseModel):
    """One message of a Messages request; its blocks are checked by :func:`chat_messages`."""

    model_config = ConfigDict(extra="allow")

    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class CountTokensRequest(BaseModel):
    """``POST /v1/messages/count_tokens``: what would be rendered (unknown fields are accepted and ignored)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    messages: list[MessageParam]
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None


class MessagesRequest(CountTokensRequest):
    """``POST /v1/messages`` (Anthropic's fields; unknown ones, such as betas' labels, are accepted and ignored)."""

    max_tokens: int
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: dict[str, Any] | None = None
    stream: bool = False
    mcp_servers: list[Any] | None = None
    output_format: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None


def chat_request(body: CountTokensRequest) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, bool]:
    """``(messages, tools, parse_tools)``: the request as :meth:`Gateway.turn` takes it; ``parse_tools`` is
    False for ``tool_choice`` ``none``. Raises ConfigError naming the field it cannot serve."""
    choice = (body.tool_choice or {}).get("type", "auto")
    if choice not in ("auto", "none"):
        raise ConfigError(
            f"tool_choice.type={choice!r} is not served (forcing a tool needs constrained decoding): "
            "send 'auto' or 'none'"
        )
    system = system_text(body.system)
    messages = [{"role": "system", "content": system}] if system is not None else []
    messages += chat_messages(body.messages)
    return messages, chat_tools(body.tools), choice != "none"


def system_text(system: str | Sequence[Mapping[str, Any]] | None) -> str | None:
    """The system prompt as one text; None when there is none."""
    if system is None or isinstance(system, str):
        return system or None
    texts = []
    for j, block in enumerate(system):
        text = _text(block, f"system.{j}")
        if not text.startswith(ATTRIBUTION):
            texts.append(text)
    return JOIN.join(texts) if texts else None


def chat_messages(messages: Sequence[MessageParam]) -> list[dict[str, Any]]:
    """The conversation as chat messages (see the module docstring)."""
    if not messages:
        raise ConfigError("messages is empty: send at least one message")
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for i, message in enumerate(messages):
        blocks = [{"type": "text", "text": message.content}] if isinstance(message.content, str) else message.content
        if message.role == "assistant":
            out.append(_assistant(blocks, f"messages.{i}", names))
            continue
        if not blocks:
            raise ConfigError(f"messages.{i}.content is empty: a user message needs a text or tool_result block")
        texts: list[str] = []
        for j, block in enumerate(blocks):
            where = f"messages.{i}.content.{j}"
            if isinstance(block, Mapping) and block.get("type") == "tool_result":
                if texts:
                    out.append({"role": "user", "content": JOIN.join(texts)})
                    texts = []
                out.append(_tool_result(block, where, names))
            else:
                texts.append(_text(block, where))
        if texts:
            out.append({"role": "user", "content": JOIN.join(texts)})
    if messages[-1].role == "assistant":
        raise ConfigError(
            f"messages.{len(messages) - 1}: a final assistant message (a prefill) is not served: the model starts its "
            "own turn; end with a user message"
        )
    return out


def _assistant(blocks: Sequence[Any], where: str, names: dict[str, str]) -> dict[str, Any]:
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind == "tool_use":
            call_id, name, arguments = block.get("id"), block.get("name"), block.get("input", {})
            if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(arguments, Mapping):
                raise ConfigError(
                    f"{where}.content.{j}: a tool_use block needs a string 'id' and 'name' and an object 'input'"
                )
            names[call_id] = name
            calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": dict(arguments)}})
        elif kind == "thinking":
            text = block.get("thinking")
            if not isinstance(text, str):
                raise ConfigError(f"{where}.content.{j}: a thinking block needs a string 'thinking'")
            thinking.append(text)
        else:
            texts.append(_text(block, f"{where}.content.{j}"))
    message: dict[str, Any] = {"role": "assistant", "content": JOIN.join(texts)}
    if calls:
        message["tool_calls"] = calls
    if thinking:
        message["reasoning_content"] = JOIN.join(thinking)
    return message


def _tool_result(block: Mapping[str, Any], where: str, names: Mapping[str, str]) -> dict[str, Any]:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str):
        raise ConfigError(f"{where}: a tool_result block needs a string 'tool_use_id'")
    content = block.get("content", "")
    if isinstance(content, list):
        content = JOIN.join(_text(part, f"{where}.content.{k}") for k, part in enumerate(content))
    elif not isinstance(content, str):
        raise ConfigError(f"{where}.content: a tool result is a string or a list of text blocks, got {content!r:.100}")
    # is_error has no place in a chat template: the model reads the result's text (Claude Code's say they failed).
    message = {"role": "tool", "tool_call_id": call_id, "content": content}
    if call_id in names:
        message["name"] = names[call_id]
    return message


def _text(block: object, where: str) -> str:
    kind = block.get("type") if isinstance(block, Mapping) else type(block).__name__
    if kind != "text":
        raise ConfigError(
            f"{where}: {kind!r} blocks are not served here (the gateway's policy reads text: text, tool_use, "
            "tool_result and thinking blocks)"
        )
    assert isinstance(block, Mapping)
    text = block.get("text")
    if not isinstance(text, str):
        raise ConfigError(f"{where}: a text block needs a string 'text'")
    return text


def chat_tools(tools: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Custom tools as chat functions; None without tools. Server and built-in tools are refused by name."""
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        name, kind, schema = tool.get("name"), tool.get("type", "custom"), tool.get("input_schema")
        if kind not in ("custom", None):
            raise ConfigError(
                f"tools.{i}: {name!r} is one of Anthropic's own tools (type {kind!r}), which the gateway does not run; "
                "declare it as a custom tool with an input_schema"
            )
        if not isinstance(name, str) or not name or not isinstance(schema, Mapping):
            raise ConfigError(f"tools.{i}: a custom tool needs a non-empty string 'name' and an object 'input_schema'")
        function: dict[str, Any] = {"name": name}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        function["parameters"] = dict(schema)
        out.append({"type": "function", "function": function})
    return out


def content_blocks(done: Completion) -> list[dict[str, Any]]:
    """The reply as Anthropic's content blocks: thinking, text, then each tool call (see the module docstring)."""
    reply = done.reply
    blocks: list[dict[str, Any]] = []
    if reply.get("reasoning_content"):
        blocks.append({"type": "thinking", "thinking": reply["reasoning_content"], "signature": ""})
    if reply.get("content"):
        blocks.append({"type": "text", "text": reply["content"]})
    for call in reply.get("tool_calls") or ():
        name, arguments = call_parts(call)
        if not isinstance(arguments, Mapping):
            arguments = {"_raw": arguments}  # the parser returns objects; kept an object for the client's schema
        blocks.append({"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:24]}", "name": name, "input": arguments})
    return blocks


def stop_reason(done: Completion, stop_sequences: Sequence[str]) -> tuple[str, str | None]:
    """Anthropic's ``stop_reason`` of the turn and the ``stop_sequence`` that ended it (None for another reason)."""
    g = done.generation
    if g.finish_reason == "length":
        return "max_tokens", None
    if done.reply.get("tool_calls"):
        return "tool_use", None
    matched = g.matched_stop if isinstance(g.matched_stop, str) else None
    if matched is None and stop_sequences:
        # A backend that does not say which stop matched: the reply's text ends with it (stop strings are kept).
        text = done.reply.get("content") or ""
        matched = next((s for s in stop_sequences if text.endswith(s)), None)
    return ("stop_sequence", matched) if matched is not None else ("end_turn", None)


def usage(done: Completion) -> dict[str, int]:
    """Anthropic's usage: ``input_tokens`` are the prompt's tokens not read from the prefix cache
    (``cache_read_input_tokens``), as Anthropic counts them; their sum is the prompt's length."""
    cached = min(done.generation.cached_tokens, len(done.prompt_ids))
    return {
        "input_tokens": len(done.prompt_ids) - cached,
        "output_tokens": len(done.generation.output_ids),
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }
