"""An OpenAI Responses request, read as the chat messages and tools every gateway route runs on.

``input`` items become OpenAI chat messages so that a client which sends back what the model
produced extends its session (no new segment, see :mod:`sandrl.inference.gateway.session`):

- a ``message`` (or a bare ``{role, content}``) is a message of that role with its text parts
  joined; ``developer`` is the ``system`` role of chat templates;
- the model's own items, in the order a turn outputs them (``reasoning``, then an assistant
  ``message``, then its ``function_call`` items), become *one* assistant message: the reasoning
  as ``reasoning_content``, the text as ``content``, the calls as ``tool_calls`` (``call_id`` as
  the call's id). A ``function_call`` with no assistant message before it is an assistant message
  without text;
- a ``function_call_output`` is a ``tool`` message for its ``call_id`` (named after its call when
  the history holds it).

``instructions`` are a first ``system`` message. The translation depends on nothing but the items
before it, so replaying a history yields the messages the session already knows. Items the
gateway cannot honour (images, files, built-in tool calls, item references) are refused with
OpenAI's error shape naming the field (:class:`RefusedField`), as are request fields that would need
what a session cannot do (``background``, ``conversation``, stored ``prompt`` templates,
``tool_choice`` ``required``, structured ``text.format``, ``truncation: auto``, tools other than
functions). Labels without effect on a policy (``store``, ``metadata``, ``prompt_cache_key``,
``reasoning``, ``parallel_tool_calls``, ``service_tier``, ``user``...) are accepted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from sandrl.errors import ConfigError

INCLUDES = frozenset({"reasoning.encrypted_content"})
"""``include`` values served: reasoning items come back as their text, with ``encrypted_content`` null (a
session keeps the model's own ids, so nothing needs to be sent back encrypted)."""
_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "summary_text", "reasoning_text"})


class ResponsesRequest(BaseModel):
    """``POST {base_url}/responses``: OpenAI's fields (unknown labels are accepted and ignored)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    previous_response_id: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = None
    include: list[str] | None = None
    reasoning: dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    truncation: str | None = None
    store: bool | None = None
    metadata: dict[str, Any] | None = None
    stream: bool = False
    background: bool | None = None
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    max_tool_calls: int | None = None
    seed: int | None = None
    """sandrl's (and vLLM's) extension: the sampling seed."""


class RefusedField(ConfigError):
    """A request field the session cannot honour: a 400 whose message starts with the field's name."""

    error_code = "invalid_request_error"

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param
        """The field, as OpenAI's ``error.param`` names it (``tools[0].type``, ``input[2].content[0].type``)."""


def check_request(body: ResponsesRequest) -> None:
    """Refuse, by name, what a session cannot honour; see the module docstring."""
    if body.background:
        raise RefusedField("background", "background responses are not served: send background=false")
    if body.conversation is not None:
        raise RefusedField(
            "conversation", "server-side conversations are not served: send the whole input, or previous_response_id"
        )
    if body.prompt is not None:
        raise RefusedField("prompt", "stored prompt templates are not served: send instructions and input")
    if body.max_tool_calls is not None:
        raise RefusedField("max_tool_calls", "is not served (the policy's reply is not cut at a number of calls)")
    if body.tool_choice not in (None, "auto", "none"):
        raise RefusedField(
            "tool_choice", f"{body.tool_choice!r} is not served (it needs constrained decoding); use 'auto' or 'none'"
        )
    if body.truncation not in (None, "disabled"):
        raise RefusedField(
            "truncation",
            f"{body.truncation!r} is not served: a session never drops history; a conversation over the context "
            "is refused as context_length_exceeded",
        )
    text_format = (body.text or {}).get("format")
    if text_format is not None and (not isinstance(text_format, Mapping) or text_format.get("type") != "text"):
        raise RefusedField("text.format", "only plain text is served (structured outputs need constrained decoding)")
    unknown = sorted(set(body.include or ()) - INCLUDES)
    if unknown:
        raise RefusedField("include", f"{unknown} are not served; served: {sorted(INCLUDES)}")
    if body.top_logprobs:
        raise RefusedField("top_logprobs", "log-probs are not served here: the session's record has them")
    if body.max_output_tokens is not None and body.max_output_tokens < 1:
        raise RefusedField("max_output_tokens", f"must be at least 1, got {body.max_output_tokens}")


def chat_tools(tools: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Responses' function tools (``{type, name, description, parameters, strict}``) as chat completions' tools."""
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type")
        if kind != "function":
            raise RefusedField(
                f"tools[{i}].type",
                f"{kind!r} tools are not served: the session's policy calls only function tools the client runs",
            )
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise RefusedField(f"tools[{i}].name", "a function tool needs a name")
        function: dict[str, Any] = {"name": name}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        function["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
        out.append({"type": "function", "function": function})
    return out


def chat_messages(
    items: str | Sequence[Mapping[str, Any]] | None, *, history: Sequence[Mapping[str, Any]] = ()
) -> list[dict[str, Any]]:
    """The chat messages of ``input`` items, after ``history`` (the messages a ``previous_response_id`` ended)."""
    if items is None:
        return []
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    reader = _Reader(history)
    for i, item in enumerate(items):
        reader.read(i, item)
    return reader.messages


class _Reader:
    """Reads items in order; see the module docstring for how the model's items group into one message."""

    def __init__(self, history: Sequence[Mapping[str, Any]]) -> None:
        self.messages: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None
        """The assistant message the model's items being read belong to; None after any other item."""
        self.names: dict[str, str] = {}
        for message in history:
            self._remember(message.get("tool_calls") or ())

    def _remember(self, calls: Sequence[Mapping[str, Any]]) -> None:
        for call in calls:
            function = call.get("function") or {}
            if isinstance(call.get("id"), str) and isinstance(function.get("name"), str):
                self.names[call["id"]] = function["name"]

    def read(self, i: int, item: Mapping[str, Any]) -> None:
        if not isinstance(item, Mapping):
            raise RefusedField(f"input[{i}]", f"an input item must be an object, got {type(item).__name__}")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            self._message(i, item)
        elif kind == "reasoning":
            self.open = {"role": "assistant", "content": None, "reasoning_content": _reasoning_text(i, item)}
            self.messages.append(self.open)
        elif kind == "function_call":
            self._function_call(i, item)
        elif kind == "function_call_output":
            self.open = None
            self.messages.append(self._tool_result(i, item))
        else:
            raise RefusedField(
                f"input[{i}].type",
                f"{kind!r} items are not served: send messages, reasoning, function_call and function_call_output "
                "items (the session's policy calls only function tools)",
            )

    def _message(self, i: int, item: Mapping[str, Any]) -> None:
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise RefusedField(f"input[{i}].role", f"must be user, assistant, system or developer, got {role!r}")
        text = _text(f"input[{i}].content", item.get("content"))
        if role == "assistant":
            if self.open is not None and not self.open["content"] and not self.open.get("tool_calls"):
                self.open["content"] = text  # the text after the turn's reasoning
            else:
                self.open = {"role": "assistant", "content": text}
                self.messages.append(self.open)
            return
        self.open = None
        self.messages.append({"role": "system" if role == "developer" else role, "content": text})

    def _function_call(self, i: int, item: Mapping[str, Any]) -> None:
        call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments", "")
        for field, value in (("call_id", call_id), ("name", name), ("arguments", arguments)):
            if not isinstance(value, str):
                raise RefusedField(f"input[{i}].{field}", f"must be a string, got {value!r}")
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        if self.open is None:
            self.open = {"role": "assistant", "content": None}
            self.messages.append(self.open)
        self.open.setdefault("tool_calls", []).append(call)
        self._remember([call])

    def _tool_result(self, i: int, item: Mapping[str, Any]) -> dict[str, Any]:
        call_id = item.get("call_id")
        if not isinstance(call_id, str):
            raise RefusedField(f"input[{i}].call_id", f"must be a string, got {call_id!r}")
        message = {"role": "tool", "tool_call_id": call_id, "content": _text(f"input[{i}].output", item.get("output"))}
        if call_id in self.names:
            message["name"] = self.names[call_id]
        return message


def _reasoning_text(i: int, item: Mapping[str, Any]) -> str:
    """A reasoning item's text: its ``content`` (the reasoning itself) when it has one, else its summary."""
    content = item.get("content")
    if content:
        return _text(f"input[{i}].content", content)
    return _text(f"input[{i}].summary", item.get("summary"))


def _text(param: str, content: object) -> str:
    """Text content: a string, or text parts joined (images, files and audio are refused by name)."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise RefusedField(param, f"must be a string or a list of text parts, got {type(content).__name__}")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "refusal" and isinstance(part, Mapping):
            texts.append(str(part.get("refusal", "")))
        elif kind in _TEXT_PARTS and isinstance(part, Mapping):
            texts.append(str(part.get("text", "")))
        else:
            raise RefusedField(f"{param}[{j}].type", f"{kind!r} parts are not served: the policy reads text only")
    return "".join(texts)
