"""Tool calls in a model's reply, read the way each model family writes them.

A reply is the decoded model output with its final stop token removed and special tokens kept.
Each family's chat template shows the model one way to call a tool, and its parser reads exactly
that way back (the formats' facts come from the templates themselves and from the parsers vLLM
and SGLang serve these models with):

- ``hermes`` (Qwen2.5, Qwen3, Hermes): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``,
  one block per call, text allowed around and between them.
- ``glm45`` (GLM-4.5, 4.6, 4.7): ``<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>...</tool_call>``.
  The template writes string values raw and everything else as JSON, so a value that reads as
  JSON other than a string becomes that value, and anything else stays the raw string; an
  argument the offered tools declare a string is always kept raw (``"123"`` stays ``"123"``).
- ``llama3_json`` (Llama 3.1, 3.2, 3.3): the reply *is* the call, ``{"name": ..., "parameters": {...}}``
  (``parameters``, not ``arguments``), optionally after ``<|python_tag|>``; several calls are
  separated by ``;`` (the convention of vLLM's and SGLang's parsers; the template renders one).

Reasoning comes first in Qwen3 and GLM-4.5 replies, ``<think>...</think>``; a reply may hold only
the ``</think>`` when the prompt opened the block. Every parser splits it off first.

A malformed call is a result, not an exception: ``errors`` holds one sentence per bad call,
written for the model to read and fix. A call that is readable but not closed is kept *and*
reported, as vLLM keeps it. ``parse`` never raises, whatever the text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sandrl.errors import ConfigError
from sandrl.inference.toolcalls.call import STRICT_JSON, ToolCall, load_json
from sandrl.inference.toolcalls.schemas import argument_schema, declared_types

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


@dataclass(frozen=True)
class ParsedReply:
    """A reply split into what the model said, what it thought and what it asked to run."""

    content: str
    """The reply's text with the tool calls and the reasoning removed, stripped."""
    reasoning: str | None
    """The ``<think>`` text (stripped) when the reply had a think block, even an empty one; else None."""
    tool_calls: tuple[ToolCall, ...]
    errors: tuple[str, ...]
    """One sentence per malformed call, for the model to read and fix."""


class ToolCallParser(Protocol):
    """Reads one family's tool-call format."""

    name: str

    def parse(self, text: str, *, tools: Sequence[Mapping[str, Any]] = ()) -> ParsedReply:
        """Split ``text``; ``tools`` (the offered OpenAI tool specs) only sharpens how values are decoded."""
        ...


# -- shared pieces ----------------------------------------------------------------------------


def split_reasoning(text: str, calls_start: str = "") -> tuple[str | None, str]:
    """``(reasoning, rest)``: the think block at the start of ``text`` and what follows it.

    A ``</think>`` before the first call (``calls_start``) closes the reasoning, whether or not
    the reply opened it (the prompt may have); an opening ``<think>`` with no close makes
    everything up to the first call reasoning (a reply cut short while thinking).
    """
    first_call = text.find(calls_start) if calls_start else -1
    limit = first_call if first_call >= 0 else len(text)
    close = text.find(THINK_CLOSE, 0, limit)
    if close >= 0:
        head = text[:close]
        return head.split(THINK_OPEN)[-1].strip(), text[close + len(THINK_CLOSE) :]
    stripped = text.lstrip()
    if stripped.startswith(THINK_OPEN):
        offset = len(text) - len(stripped) + len(THINK_OPEN)
        return text[offset:limit].strip(), text[limit:]
    return None, text


def _arguments_object(value: Any) -> dict[str, Any] | None:
    """Arguments as a dict: an object, a JSON string holding one, or nothing at all ({}); None when neither."""
    if value is None:
        return {}
    if isinstance(value, str):
        value, problem = load_json(value) if value.strip() else ({}, None)
        if problem is not None:
            return None
    return dict(value) if isinstance(value, Mapping) else None


def _blocks(text: str, open_tag: str, close_tag: str) -> tuple[list[str], list[tuple[str, bool]]]:
    """Each ``open_tag``...``close_tag`` block's body with whether it was closed, and the text around them:
    one piece before each block and one after the last.

    A block with no close ends where the next one opens, or at the end of the text.
    """
    pieces: list[str] = []
    blocks: list[tuple[str, bool]] = []
    pos = 0
    while (start := text.find(open_tag, pos)) >= 0:
        pieces.append(text[pos:start])
        body = start + len(open_tag)
        end = text.find(close_tag, body)
        following = text.find(open_tag, body)
        if end >= 0 and (following < 0 or end < following):
            blocks.append((text[body:end], True))
            pos = end + len(close_tag)
        else:
            pos = following if following >= 0 else len(text)
            blocks.append((text[body:pos], False))
    pieces.append(text[pos:])
    return pieces, blocks


def _numbered(calls: list[ToolCall]) -> tuple[ToolCall, ...]:
    return tuple(ToolCall(c.name, c.arguments, f"call_{i}") for i, c in enumerate(calls))


def _not_closed(n: int, close_tag: str) -> str:
    return f"tool call {n} is not closed: end it with {close_tag}."


# -- Hermes / Qwen ----------------------------------------------------------------------------


class HermesParser:
    """``<tool_call>`` blocks holding ``{"name": ..., "arguments": {...}}`` (Qwen2.5, Qwen3, Hermes 2/3)."""

    name = "hermes"
    OPEN = "<tool_call>"
    CLOSE = "</tool_call>"
    EXAMPLE = '<tool_call>{"name": "<tool name>", "arguments": {...}}</tool_call>'

    def parse(self, text: str, *, tools: Sequence[Mapping[str, Any]] = ()) -> ParsedReply:
        reasoning, body = split_reasoning(text, self.OPEN)
        pieces, blocks = _blocks(body, self.OPEN, self.CLOSE)
        text_parts = [pieces[0]]
        calls: list[ToolCall] = []
        errors: list[str] = []
        for n, ((block, closed), after) in enumerate(zip(blocks, pieces[1:], strict=True), start=1):
            call, problem, rest = self._call(block, closed)
            if call is not None:
                calls.append(call)
            text_parts += [rest, after]
            if problem is not None:
                errors.append(f"tool call {n} {problem}. Write each call as {self.EXAMPLE}.")
            elif not closed:
                errors.append(_not_closed(n, self.CLOSE))
        return ParsedReply("".join(text_parts).strip(), reasoning, _numbered(calls), tuple(errors))

    def _call(self, block: str, closed: bool) -> tuple[ToolCall | None, str | None, str]:
        """The call in one block, what is wrong with it, and the text after it in an unclosed block."""
        rest = ""
        if closed:
            obj, problem = load_json(block.strip())
        else:
            # An unclosed block runs to the end of the reply: the JSON is its start, the rest is text.
            start = len(block) - len(block.lstrip())
            try:
                obj, end = STRICT_JSON.raw_decode(block, start)
                problem, rest = None, block[end:]
            except RecursionError:
                obj, problem = None, "it is nested too deeply"
            except ValueError as exc:
                obj, problem = None, str(exc)
            if problem is not None:
                return None, f"is not closed with {self.CLOSE} and is not valid JSON: {problem}", ""
        if problem is not None:
            return None, f"is not valid JSON: {problem}", rest
        if not isinstance(obj, Mapping):
            return None, f"must be a JSON object, got {_kind(obj)}", rest
        name = obj.get("name")
        if not isinstance(name, str) or not name.strip():
            return None, 'has no "name" (a non-empty string)', rest
        raw = obj.get("arguments", obj.get("parameters"))
        arguments = _arguments_object(raw)
        if arguments is None:
            return None, f'has "arguments" that are not a JSON object: {_kind(raw)}', rest
        return ToolCall(name.strip(), arguments), None, rest


def _kind(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."


# -- GLM-4.5 ----------------------------------------------------------------------------------


class GLM45Parser:
    """``<tool_call>NAME`` then ``<arg_key>``/``<arg_value>`` pairs (GLM-4.5, 4.6; 4.7 drops the newlines)."""

    name = "glm45"
    OPEN = "<tool_call>"
    CLOSE = "</tool_call>"
    KEY, KEY_END = "<arg_key>", "</arg_key>"
    VALUE, VALUE_END = "<arg_value>", "</arg_value>"
    EXAMPLE = "<tool_call>NAME <arg_key>KEY</arg_key> <arg_value>VALUE</arg_value> </tool_call>"

    def parse(self, text: str, *, tools: Sequence[Mapping[str, Any]] = ()) -> ParsedReply:
        reasoning, body = split_reasoning(text, self.OPEN)
        pieces, blocks = _blocks(body, self.OPEN, self.CLOSE)
        calls: list[ToolCall] = []
        errors: list[str] = []
        for n, (block, closed) in enumerate(blocks, start=1):
            call, problem = self._call(block, tools)
            if call is not None:
                calls.append(call)
            if problem is not None:
                unclosed = "" if closed else f"is not closed with {self.CLOSE} and "
                errors.append(f"tool call {n} {unclosed}{problem}. Write each call as {self.EXAMPLE}.")
            elif not closed:
                errors.append(_not_closed(n, self.CLOSE))
        return ParsedReply("".join(pieces).strip(), reasoning, _numbered(calls), tuple(errors))

    def _call(self, block: str, tools: Sequence[Mapping[str, Any]]) -> tuple[ToolCall | None, str | None]:
        ends = [i for i in (block.find("\n"), block.find(self.KEY)) if i >= 0]
        name_end = min(ends) if ends else len(block)
        name = block[:name_end].strip().removesuffix("\\n").strip()
        if not name:
            return None, "has no tool name after <tool_call>"
        arguments: dict[str, Any] = {}
        pos = name_end
        while (pos := _skip_space(block, pos)) < len(block):
            if not block.startswith(self.KEY, pos):
                return None, f"({name}) has unexpected text {_kind(block[pos : pos + 30])} where an <arg_key> should be"
            key_end = block.find(self.KEY_END, pos)
            if key_end < 0:
                return None, f"({name}) has an <arg_key> not closed with {self.KEY_END}"
            key = block[pos + len(self.KEY) : key_end].strip()
            pos = _skip_space(block, key_end + len(self.KEY_END))
            if not block.startswith(self.VALUE, pos):
                return None, f"({name}) has no <arg_value> after the key {key!r}"
            value_end = block.find(self.VALUE_END, pos)
            if value_end < 0:
                return None, f"({name}) has the value of {key!r} not closed with {self.VALUE_END}"
            raw = block[pos + len(self.VALUE) : value_end]
            arguments[key] = _glm_value(raw, declared_types(argument_schema(tools, name, key)))
            pos = value_end + len(self.VALUE_END)
        return ToolCall(name, arguments), None


def _skip_space(text: str, pos: int) -> int:
    """Past whitespace, and past a literal backslash-n (GLM models sometimes write the escape)."""
    while pos < len(text):
        if text[pos].isspace():
            pos += 1
        elif text.startswith("\\n", pos):
            pos += 2
        else:
            break
    return pos


def _glm_value(raw: str, declared: tuple[str, ...]) -> Any:
    """A value as the template wrote it: strings raw, everything else as JSON."""
    if declared and all(t in ("string", "null") for t in declared):
        return raw
    value, problem = load_json(raw)
    return raw if problem is not None or isinstance(value, str) else value


# -- Llama 3.x JSON ---------------------------------------------------------------------------


class Llama3JsonParser:
    """The reply is ``{"name": ..., "parameters": {...}}``, maybe after ``<|python_tag|>``, several joined by ``;``."""

    name = "llama3_json"
    TAG = "<|python_tag|>"
    EXAMPLE = '{"name": "<tool name>", "parameters": {...}}'

    def parse(self, text: str, *, tools: Sequence[Mapping[str, Any]] = ()) -> ParsedReply:
        reasoning, body = split_reasoning(text, self.TAG)
        tag = body.find(self.TAG)
        if tag >= 0:
            before, action = body[:tag], body[tag + len(self.TAG) :]
        elif body.lstrip().startswith("{"):
            before, action = "", body.lstrip()
        else:
            return ParsedReply(body.strip(), reasoning, (), ())
        calls: list[ToolCall] = []
        errors: list[str] = []
        trailing = ""
        pos, n = 0, 0
        while (pos := _skip_space(action, pos)) < len(action):
            n += 1
            try:
                obj, pos = STRICT_JSON.raw_decode(action, pos)
                problem = None if _looks_like_call(obj) else f'must be a JSON object with a "name", got {_kind(obj)}'
            except RecursionError:
                obj, problem = None, "is nested too deeply"
            except ValueError as exc:
                obj, problem = None, f"is not valid JSON: {exc}"
            if problem is not None and tag < 0 and n == 1 and ('"name"' not in action or obj is not None):
                return ParsedReply(body.strip(), reasoning, (), ())  # a JSON answer or prose, not a call
            if problem is None:
                raw = obj.get("parameters", obj.get("arguments"))
                arguments = _arguments_object(raw)
                if arguments is None:
                    problem = f'has "parameters" that are not a JSON object: {_kind(raw)}'
                else:
                    calls.append(ToolCall(obj["name"].strip(), arguments))
            if problem is not None:
                errors.append(f"tool call {n} {problem}. Write a call as {self.EXAMPLE}, several separated by ';'.")
                break  # what follows a broken call cannot be told apart from it
            end, pos = pos, _skip_space(action, pos)
            if action.startswith(";", pos):
                pos += 1
            elif pos < len(action) and not action.startswith("{", pos):
                trailing = action[end:]
                break
        return ParsedReply((before + trailing).strip(), reasoning, _numbered(calls), tuple(errors))


def _looks_like_call(obj: Any) -> bool:
    return isinstance(obj, Mapping) and isinstance(obj.get("name"), str) and bool(obj["name"].strip())


# -- the registry -----------------------------------------------------------------------------

PARSERS: Mapping[str, ToolCallParser] = {
    parser.name: parser for parser in (HermesParser(), GLM45Parser(), Llama3JsonParser())
}
"""The tool-call parsers by name, as vLLM and SGLang name them (``--tool-call-parser``)."""


def get_parser(name: str) -> ToolCallParser:
    """The parser called ``name``."""
    try:
        return PARSERS[name]
    except KeyError:
        raise ConfigError(
            f"unknown tool-call parser {name!r}; the known parsers are: {', '.join(sorted(PARSERS))}"
        ) from None


def detect_parser(chat_template: str) -> str | None:
    """The parser a chat template's text implies, or None when it shows no tool format sandrl reads.

    Qwen3-Coder and Qwen3.5 also use ``<tool_call>``, with ``<function=...>`` XML inside rather
    than JSON: that format has no parser here, so it gives None rather than a wrong ``hermes``.
    """
    if "<tool_call>" in chat_template:
        if "<function=" in chat_template:
            return None
        return "glm45" if "<arg_key>" in chat_template else "hermes"
    if "<|python_tag|>" in chat_template or ('"parameters"' in chat_template and "<|eot_id|>" in chat_template):
        return "llama3_json"
    return None
