"""A chat template, seen incrementally: the ids to append after each model turn, token-exact.

A multi-turn conversation is never re-rendered. Its ids are the rendered prompt, then per turn
the model's output ids exactly as sampled, then the ids the template puts between that output
and the next assistant turn (the tool results or the user's reply, and the next assistant
prefix). :class:`ChatFormat` computes that *continuation* for any chat template:

- sandrl's byte tokenizer renders each turn on its own, so the continuation is the next turns'
  ids (:meth:`~sandrl.inference.tokenizer.ByteTokenizer.encode_turn`) and the assistant prefix;
- for a Hugging Face template, a stand-in conversation is rendered whose last assistant turn is
  followed by the new messages; the continuation is what the rendering holds after that assistant
  turn's *closing token* (the first end-of-sequence token after its content: ``<|im_end|>`` for
  Qwen, ``<|eot_id|>`` for Llama 3, ``<|observation|>`` before a tool result for GLM-4.5).

Why the closing token and not a prefix comparison: templates such as Qwen3's render the *last*
assistant turn differently from earlier ones (an empty ``<think></think>`` block only on the
last), so "render before, render after, take the difference" finds no common prefix. Counting
from the closing token is independent of how the template re-renders the turn itself, and the
model's own ids for that turn are kept as sampled ("thinking kept": peers call it the
interleaved strategy). The training ids are therefore exactly the ids the model saw and produced.

A turn the model closed with another stop token (Qwen's ``<|endoftext|>`` instead of
``<|im_end|>``, Llama's ``<|eom_id|>``) or left open (its per-turn token limit) gets the
template's closing token appended (loss mask 0) before the continuation, so the next turn always
starts where the template would start it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sandrl.errors import ConfigError
from sandrl.inference.tokenizer import ByteTokenizer, Message, Tokenizer, Tools, message_text
from sandrl.inference.toolcalls import ToolCallParser, detect_parser, get_parser

_STAND_IN = ({"role": "system", "content": "s"}, {"role": "user", "content": "u"})
_PROBE = ({"role": "tool", "content": "x", "tool_call_id": "call_0", "name": "bash"},)
"""A tool result after the assistant turn of a demonstration, so that the turn is rendered closed."""


@dataclass(frozen=True)
class Continuation:
    """What follows a model turn: the template's closing token of that turn, then ``ids``."""

    closer: int
    ids: list[int]


class ChatFormat:
    """The pieces of a conversation's ids, for one tokenizer and one set of tools."""

    def __init__(self, tokenizer: Tokenizer, *, tools: Tools | None = None) -> None:
        self.tokenizer = tokenizer
        self.tools: list[Mapping[str, Any]] | None = [dict(t) for t in tools] if tools else None
        self.stop_ids: frozenset[int] = frozenset(tokenizer.eos_token_ids)
        if not self.stop_ids:
            raise ConfigError("the tokenizer has no end-of-sequence token, so a model turn could never end")
        self._head: list[int] | None = None

    def render(self, messages: Sequence[Message], *, add_generation_prompt: bool = False) -> list[int]:
        return self.tokenizer.encode_messages(messages, add_generation_prompt=add_generation_prompt, tools=self.tools)

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """The opening: the messages (system prompt, task...) and the first assistant prefix."""
        return self.render(messages, add_generation_prompt=True)

    def continuation(self, assistant: Message, appended: Sequence[Message]) -> Continuation:
        """The ids after a model turn whose parsed message is ``assistant``, for the ``appended`` messages.

        ``appended`` (tool results, a user message) must not be empty; the next assistant prefix ends the ids."""
        if not appended:
            raise ConfigError("a continuation needs at least one message after the model's turn")
        tok = self.tokenizer
        if isinstance(tok, ByteTokenizer):
            ids: list[int] = []
            for message in appended:
                ids += tok.encode_messages([message])[1:]  # without <|bos|>
            return Continuation(tok.im_end_id, ids + tok.assistant_prefix_ids())
        full, _, close = self._rendered(_stand_in_assistant(assistant), appended)
        return Continuation(full[close], full[close + 1 :])

    def append_ids(self, output_ids: Sequence[int], assistant: Message, appended: Sequence[Message]) -> list[int]:
        """The ids to append after ``output_ids``: the closing token if the model did not end with it, then the rest."""
        follow = self.continuation(assistant, appended)
        closed = bool(output_ids) and output_ids[-1] == follow.closer
        return follow.ids if closed else [follow.closer, *follow.ids]

    def reply_ids(self, assistant: Message) -> list[int]:
        """The ids the template renders for the assistant message ``assistant``, its closing token included:
        what a model following the template would write (a demonstration for supervised training)."""
        tok = self.tokenizer
        if isinstance(tok, ByteTokenizer):
            return [*tok.encode(message_text(assistant)), tok.im_end_id]
        full, start, close = self._rendered(assistant, _PROBE)
        return full[start : close + 1]

    def _rendered(self, assistant: Message, appended: Sequence[Message]) -> tuple[list[int], int, int]:
        """The stand-in conversation ending with ``assistant`` then ``appended``, rendered; where the assistant's
        turn starts in it, and where its closing token (the first stop id after that) is."""
        if self._head is None:  # the same for every call: rendered once
            self._head = self.render(_STAND_IN, add_generation_prompt=True)
        full = self.render([*_STAND_IN, assistant, *appended], add_generation_prompt=True)
        start = _common_prefix(self._head, full)
        for position in range(start, len(full)):
            if full[position] in self.stop_ids:
                return full, start, position
        raise ConfigError(
            "the chat template closes an assistant turn with no token the model stops on: add the template's "
            "end-of-turn token to eos_token_id in the checkpoint's generation_config.json"
        )

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids)

    def encode(self, text: str) -> list[int]:
        """``text`` as it encodes in a message (what an observation's token budget counts)."""
        return self.tokenizer.encode_text(text)

    def reply_text(self, output_ids: Sequence[int]) -> str:
        """The model's reply as text: its ids without the final stop token, special tokens kept."""
        ids = list(output_ids)
        if ids and ids[-1] in self.stop_ids:
            ids.pop()
        return self.tokenizer.decode(ids)


def tool_parser_for(tokenizer: Tokenizer, name: str | None = None) -> ToolCallParser:
    """The parser named ``name``, else the one the tokenizer's chat template implies (Hermes for the byte one)."""
    if name is not None:
        return get_parser(name)
    template = tokenizer.chat_template
    if template is None:
        return get_parser("hermes")  # the byte tokenizer renders calls in the Hermes format
    detected = detect_parser(template)
    if detected is None:
        raise ConfigError(
            "cannot tell this chat template's tool-call format; set the parser by name "
            "([rollout] tool_parser, --tool-parser: hermes, glm45, llama3_json)"
        )
    return get_parser(detected)


def _stand_in_assistant(assistant: Message) -> dict[str, Any]:
    # The real content and arguments could be long and change nothing of what follows the turn's
    # closing token, so a short stand-in is rendered. One call at most: some templates (Llama 3.1)
    # refuse several, and the count changes nothing after.
    calls = list(assistant.get("tool_calls") or ())[:1]
    stand_in: dict[str, Any] = {"role": "assistant", "content": "a"}
    if calls:
        call = calls[0]
        function = call.get("function", call) if isinstance(call, Mapping) else {}
        stand_in["tool_calls"] = [
            {
                "id": str(call.get("id") or "call_0") if isinstance(call, Mapping) else "call_0",
                "type": "function",
                "function": {"name": str(function.get("name") or "tool"), "arguments": {}},
            }
        ]
    return stand_in


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
