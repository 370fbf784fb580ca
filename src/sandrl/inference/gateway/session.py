"""One gateway session: an agent harness's conversation, recorded token in, token out.

A harness (mini-swe-agent, Terminus-2, the OpenAI Agents SDK...) sends the *whole* message
history on every call, as OpenAI's API has it. The session keeps the ids the model actually saw
and produced, and turns each call into the fewest new ids:

- **Extension** (the usual case): the call's messages begin with exactly the messages the session
  knows (the previous call's plus the assistant reply it returned), and only non-assistant
  messages follow (tool results, a user turn). Only those are rendered
  (:meth:`~sandrl.inference.chat.ChatFormat.append_ids`) and appended after the model's
  own output ids, which are never re-tokenized.
- **New segment**: anything else (the harness rewrote or dropped a message, summarised the
  history, changed the tools, or sent its own assistant message) starts a new *segment*: the
  call's messages are rendered whole and the model continues from that rendering. The session
  records where and why (``segment_starts``, each turn's ``segment_reason``): the old ids are
  not silently re-tokenized into something the model never saw. Peers call this a message
  matcher; the trainer trains each segment as its own sequence.

Messages are compared as the harness sees them: role, content (``None`` and ``""`` alike, text
parts joined), and tool calls by name and parsed arguments (ids and key order ignored, since
harnesses re-serialize them).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sandrl.errors import ConfigError, InferenceError
from sandrl.http_auth import new_token
from sandrl.inference.base import Generation, InferenceClient, SamplingParams
from sandrl.inference.chat import ChatFormat
from sandrl.inference.fleet.affinity import RouteKey
from sandrl.inference.toolcalls import ToolCallParser


def normalize(message: Mapping[str, Any]) -> tuple[Any, ...]:
    """What of a message the matcher compares (see the module docstring)."""
    role = message.get("role")
    content = message_content(message)
    calls: list[tuple[str, str]] = []
    for call in message.get("tool_calls") or ():
        name, arguments = call_parts(call)
        calls.append((str(name), json.dumps(arguments, sort_keys=True)))
    return (role, content, tuple(calls))


def call_parts(call: object) -> tuple[Any, Any]:
    """An OpenAI tool call's function name and arguments, the arguments decoded from their JSON string
    (left the string when it is not JSON): harnesses send either form."""
    function = call.get("function", call) if isinstance(call, Mapping) else {}
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):
            arguments = json.loads(arguments)
    return function.get("name"), arguments


def message_content(message: Mapping[str, Any]) -> str:
    """A message's text: a string, ``None`` as ``""``, or OpenAI's text parts joined."""
    content = message.get("content")
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise ConfigError(f"only text message parts are supported, got a {kind!r} part")
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise ConfigError(f"a message's content must be a string, null or a list of text parts, got {content!r}")


def plain(message: Mapping[str, Any]) -> dict[str, Any]:
    """The message as the chat template takes it: text content, tool calls with dict arguments."""
    out: dict[str, Any] = {k: v for k, v in message.items() if k in ("role", "name", "tool_call_id")}
    out["content"] = message_content(message)
    calls = []
    for call in message.get("tool_calls") or ():
        name, arguments = call_parts(call)
        if isinstance(arguments, str):
            arguments = {"_raw": arguments}  # not JSON: templates want an object
        calls.append({"id": call.get("id", ""), "type": "function", "function": {"name": name, "arguments": arguments}})
    if calls:
        out["tool_calls"] = calls
    return out


@dataclass
class SessionTurn:
    """One completion of the session."""

    index: int
    output_start: int
    output_end: int
    context_tokens: int
    """The length of the prompt the model saw (its segment so far)."""
    finish_reason: str
    weight_version: int
    start_weight_version: int | None
    output_weight_versions: list[int] | None
    model_s: float
    new_segment: bool
    segment_reason: str | None
    appended: list[dict[str, Any]]
    """The call's new messages (all of them on a new segment)."""
    reply: dict[str, Any]
    """The assistant message returned."""
    gateway_s: float = 0.0
    """The gateway's own time on this call, the model's excluded (its per-turn overhead)."""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Completion:
    """What one call produced, for the route to answer with."""

    generation: Generation
    prompt_ids: list[int]
    reply: dict[str, Any]
    finish_reason: str
    turn: SessionTurn


@dataclass
class Session:
    """See the module docstring."""

    id: str
    key: str = field(default_factory=new_token, repr=False)
    """The session's own credential: its harness's ``api_key``, sent as ``Authorization: Bearer``; no other
    session's routes take it."""
    chat_tools_key: str | None = None
    ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    segment_starts: list[int] = field(default_factory=list)
    turns: list[SessionTurn] = field(default_factory=list)
    known: list[tuple[Any, ...]] = field(default_factory=list)
    """The conversation as the harness will send it back: the last call's messages and the reply."""
    last_output: list[int] = field(default_factory=list)
    last_reply: dict[str, Any] | None = None
    created_at: float = field(default_factory=time.time)
    used_at: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    prompt_len: int = 0
    """The first segment's prompt length."""
    max_turns: int | None = None
    """Most completions; the next call is refused (``context_length_exceeded``) and ``stopped`` says why."""
    max_total_tokens: int | None = None
    """Most ids in a segment's prompt; a call over it is refused as ``context_length_exceeded``."""
    stopped: str | None = None
    """``max_turns`` or ``max_tokens`` once a call was refused for the budget."""
    failure: InferenceError | None = None
    """The policy's failure under a call (the inference server's, not the harness's): an infra error."""
    max_new_tokens: int | None = None
    """Most tokens one completion may take, whatever the client asks or leaves unsaid (Codex sends no
    ``max_output_tokens``: without it a reply may run to the budget); None: the client's, else the budget."""
    temperature: float | None = None
    """The temperature of every completion, whatever the client sends (a CLI agent sends none: the run
    decides how its policy samples); None: the client's, else 1."""
    sandbox: str | None = None
    """The sandbox whose forwarded port alone may call it (a CLI agent's, bound by its harness as the
    forward opens; :mod:`sandrl.inference.auth`); None: no sandbox may."""
    route: RouteKey | None = None
    """The routing key its calls carry (:mod:`sandrl.inference.fleet.affinity`): the episode's that opened it,
    else its own; a router keeps them on one engine."""
    last_response: tuple[str, list[dict[str, Any]]] | None = None
    """The id of its latest OpenAI Responses answer and the conversation that answer ended, as chat messages
    without the call's ``instructions``: what a call naming it as ``previous_response_id`` continues
    (:mod:`sandrl.inference.gateway.responses`)."""

    @classmethod
    def new(cls, *, max_turns: int | None = None, max_total_tokens: int | None = None) -> Session:
        return cls(id=f"sess-{uuid.uuid4().hex[:16]}", max_turns=max_turns, max_total_tokens=max_total_tokens)

    def _add(self, ids: Sequence[int], *, model: bool, logprobs: Sequence[float] = ()) -> None:
        self.ids += ids
        self.loss_mask += [1 if model else 0] * len(ids)
        self.logprobs += list(logprobs) if model else [0.0] * len(ids)

    def _match(self, norm: Sequence[tuple[Any, ...]], tools_key: str | None) -> tuple[int, str | None]:
        """How many known messages the call's (normalized) messages extend (0 with the reason they do not)."""
        if not self.known:
            return 0, None
        if tools_key != self.chat_tools_key:
            return 0, "the tools changed"
        n = len(self.known)
        for i, (seen, sent) in enumerate(zip(self.known, norm, strict=False)):
            if seen != sent:
                return 0, f"message {i} ({sent[0]}) differs from the one the model saw"
        if len(norm) <= n:
            return 0, f"the call sent {len(norm)} messages, not more than the {n} already seen"
        if any(m[0] == "assistant" for m in norm[n:]):
            return 0, "the call adds an assistant message the model did not write"
        return n, None

    async def complete(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        params: SamplingParams,
        *,
        policy: InferenceClient,
        chat: ChatFormat,
        parser: ToolCallParser | None,
        max_context: int | None,
    ) -> Completion:
        """Extend (or start a segment), generate, parse the reply; see the module docstring."""
        if not messages:
            raise ConfigError("messages is empty: send at least one message")
        tools_key = json.dumps(list(tools), sort_keys=True) if tools else None
        if self.max_turns is not None and len(self.turns) >= self.max_turns:
            self.stopped = "max_turns"
            # Said in OpenAI's context-length words: client libraries (litellm, the harnesses' retry loops)
            # give up on those at once, where a plain 400 is retried with backoff for a minute.
            raise ConfigError(
                f"This model's maximum context length is reached: the session's budget of {self.max_turns} "
                "model turns is used up.",
                error_code="context_length_exceeded",
            )
        norm = [normalize(m) for m in messages]
        extends, reason = self._match(norm, tools_key)
        if extends:
            appended = [plain(m) for m in messages[extends:]]
            assert self.last_reply is not None
            added = chat.append_ids(self.last_output, self.last_reply, appended)
            segment = self.segment_starts[-1]
        else:
            appended = [plain(m) for m in messages]
            added = chat.prompt_ids(appended)
            segment = len(self.ids)
        prompt_len = len(self.ids) - segment + len(added)
        limits = [n for n in (max_context, self.max_total_tokens) if n is not None]
        if limits and prompt_len >= min(limits):
            self.stopped = "max_tokens"
            raise ConfigError(
                # OpenAI's wording, which client libraries (litellm, the openai package) classify by.
                f"This model's maximum context length is {min(limits)} tokens (the session's budget); "
                f"the conversation has {prompt_len}.",
                error_code="context_length_exceeded",
            )
        if limits:
            params = replace(params, max_new_tokens=min(params.max_new_tokens, min(limits) - prompt_len))
        if self.max_new_tokens is not None:
            params = replace(params, max_new_tokens=min(params.max_new_tokens, self.max_new_tokens))
        if self.temperature is not None:
            params = replace(params, temperature=self.temperature)
        prompt = [*self.ids[segment:], *added]
        started = time.perf_counter()
        # The session changes only once the model has answered: a client that retries a failed call (the
        # Anthropic SDK and Claude Code retry 5xx answers) sends the same messages, which must extend the
        # same ids, not ids that already hold the failed call's prompt.
        try:
            generation = await policy.generate(prompt, params)
        except InferenceError as exc:
            self.failure = exc
            raise
        if generation.finish_reason == "abort":
            self.failure = InferenceError(
                "the inference server aborted the request (it is shutting down or its weights failed to load)",
                error_code="inference_aborted",
            )
            raise self.failure
        model_s = time.perf_counter() - started
        self._add(added, model=False)
        if not extends:
            self.segment_starts.append(segment)
            if segment == 0:
                self.prompt_len = len(self.ids)
        self.chat_tools_key = tools_key
        context = len(self.ids)
        self._add(generation.output_ids, model=True, logprobs=generation.output_logprobs)
        reply, finish = reply_message(chat, parser, generation, tools or ())
        turn = SessionTurn(
            index=len(self.turns),
            output_start=context,
            output_end=len(self.ids),
            context_tokens=len(prompt),
            finish_reason=generation.finish_reason,
            weight_version=generation.weight_version,
            start_weight_version=generation.start_weight_version,
            output_weight_versions=generation.output_weight_versions,
            model_s=model_s,
            new_segment=not extends,
            segment_reason=reason,
            appended=appended,
            reply=reply,
        )
        self.turns.append(turn)
        self.known = [*norm, normalize(reply)]
        self.last_output = list(generation.output_ids)
        self.last_reply = plain(reply)
        self.used_at = time.monotonic()
        return Completion(generation, prompt, reply, finish, turn)

    def record(self) -> dict[str, Any]:
        """The trajectory so far: ``GET /v1/sessions/{id}``."""
        return {
            "id": self.id,
            "ids": self.ids,
            "loss_mask": self.loss_mask,
            "logprobs": self.logprobs,
            "prompt_len": self.prompt_len,
            "segment_starts": self.segment_starts or [0],
            "turns": [t.to_dict() for t in self.turns],
            "created_at": self.created_at,
            "stopped": self.stopped,
        }


def reply_message(
    chat: ChatFormat, parser: ToolCallParser | None, generation: Generation, tools: Sequence[Mapping[str, Any]]
) -> tuple[dict[str, Any], str]:
    """The assistant message of a generation, and OpenAI's finish reason for it."""
    text = chat.reply_text(generation.output_ids)
    finish: str = generation.finish_reason
    if parser is None:
        return {"role": "assistant", "content": text}, finish
    parsed = parser.parse(text, tools=tools)
    reply: dict[str, Any] = {"role": "assistant", "content": parsed.content or None}
    if parsed.reasoning is not None:
        reply["reasoning_content"] = parsed.reasoning
    if parsed.tool_calls:
        reply["tool_calls"] = [call.to_openai() for call in parsed.tool_calls]
        if finish == "stop":
            finish = "tool_calls"
    elif parsed.errors and reply["content"] is None:
        reply["content"] = text  # a malformed call is shown as the text it was, for the harness to react to
    return reply, finish
