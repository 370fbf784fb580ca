"""The session gateway: an OpenAI-compatible endpoint per session, in front of any policy.

Two ways it is served:

- **The runner's** (:func:`create_gateway_app`, which ``sandrl eval`` / ``sandrl train`` serve on
  a loopback port for harness agents, in front of any
  :class:`~sandrl.inference.base.InferenceClient`: the embedded engine, SGLang, vLLM): sessions
  are opened only in-process, by the runner for its episode (:meth:`Gateway.open`), and the
  harness is handed the session's ``base_url`` and its key. Only a session's own routes are
  served (chat completions, models); there is no route to open, list, read or close one.
- **On** ``sandrl serve inference``: also ``POST /v1/sessions`` (behind the server's token when
  it has one), ``GET`` and ``DELETE /v1/sessions/{id}``.

Every session route needs that session's key, ``Authorization: Bearer <key>`` (an OpenAI
client's ``api_key``) or ``x-api-key: <key>`` (an Anthropic client's), or the inference server's
token: one session's key cannot read, write or close another (:mod:`sandrl.inference.auth`, which
also bounds request bodies and, without a token, answers only requests addressed to loopback and
from no web page).

Routes:

- ``POST /v1/sessions`` → ``{"id", "base_url", "api_key"}``: a harness's OpenAI client takes
  ``base_url`` and ``api_key`` (the session's key). An optional body sets the session's budget,
  ``max_turns`` and ``max_total_tokens``: a call over it is refused as ``context_length_exceeded``
  (OpenAI's words for either budget: clients give up on them at once) and the record's
  ``stopped`` says which. At most ``max_sessions`` are held (429 ``too_many_sessions`` beyond).
- ``POST {base_url}/chat/completions`` (also ``{base_url}/v1/chat/completions``, for clients that append
  ``/v1``): OpenAI's chat completion with ``tools``, ``tool_choice``
  (``auto``, or ``none``: calls are not parsed), ``n`` = 1, ``temperature``, ``top_p``,
  ``max_tokens`` / ``max_completion_tokens``, ``stop``, ``stop_token_ids``, ``seed``,
  ``logprobs`` / ``top_logprobs`` and vLLM's ``return_token_ids``. The answer has ``tool_calls``
  (parsed by the model family's parser), ``reasoning_content`` where the family thinks,
  ``usage``, and sandrl's ``weight_version`` and ``session`` (segment, whether this call
  started one and why). The model name is not checked: a session belongs to one policy.
  ``stream`` (with ``stream_options.include_usage``) answers the same as OpenAI's chunks, tool-call
  deltas included (:mod:`~sandrl.inference.gateway.chat_stream`).
  Refused (400, named): ``n`` > 1, ``tool_choice`` ``required`` or a named function (no constrained
  decoding), ``stream_options`` other than ``include_usage``.
- ``POST {base_url}/responses`` (also ``{base_url}/v1/responses``): OpenAI Responses, what Codex
  speaks: input items, function tools and calls, ``instructions``, ``previous_response_id``,
  ``stream`` (OpenAI's events); registered by :mod:`~sandrl.inference.gateway.responses`, which says
  what is served and refused.
- ``POST {base_url}/v1/messages`` and ``/v1/messages/count_tokens``: Anthropic Messages, what Claude
  Code speaks: system, text / ``tool_use`` / ``tool_result`` / ``thinking`` blocks, custom tools,
  ``stream`` (Anthropic's events), errors in Anthropic's shape; registered by
  :mod:`~sandrl.inference.gateway.anthropic_routes`, which says what is served and refused.
- ``GET {base_url}/models`` (also ``{base_url}/v1/models``): the served model, for clients that
  look it up.
- ``GET /v1/sessions/{id}`` → the trajectory so far: ids, loss mask, per-token log-probs,
  ``segment_starts``, and the turns with their messages and weight versions.
- ``DELETE /v1/sessions/{id}``: forget it (answers the final record). A session idle for an hour
  (``idle_ttl_s``) is forgotten when another opens, so a harness that died leaks nothing.

A streamed answer is the finished turn sent as the vendor's event sequence: the policy
(:meth:`~sandrl.inference.base.InferenceClient.generate`) returns whole generations.

How a call becomes ids is :mod:`sandrl.inference.gateway.session`'s job.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from pydantic import BaseModel, ConfigDict

from sandrl.errors import ConfigError, SessionNotFoundError
from sandrl.inference.auth import MAX_BODY_BYTES, install_guards
from sandrl.inference.base import InferenceClient, SamplingParams
from sandrl.inference.chat import ChatFormat, tool_parser_for
from sandrl.inference.fleet import affinity
from sandrl.inference.gateway.chat_stream import include_usage, stream_response
from sandrl.inference.gateway.session import Completion, Session
from sandrl.inference.http_errors import install_error_handlers
from sandrl.inference.openai_stream import chat_logprobs
from sandrl.inference.routes_shared import openai_sampling
from sandrl.inference.tokenizer import Tokenizer
from sandrl.inference.toolcalls import ToolCallParser

DEFAULT_REPLY_TOKENS = 4096
"""A reply's token budget when neither the request nor the policy's context length gives one."""


class Gateway:
    """The sessions of one policy; see the module docstring."""

    def __init__(
        self,
        policy: InferenceClient,
        *,
        model_name: str,
        tool_parser: str | None = None,
        max_sessions: int = 4096,
        idle_ttl_s: float = 3600.0,
    ) -> None:
        if policy.tokenizer is None:
            raise ConfigError(
                "the session gateway renders chat templates and needs the policy's tokenizer; the model must be "
                "'tiny' or a checkpoint directory with its tokenizer files"
            )
        self.policy = policy
        self.tokenizer: Tokenizer = policy.tokenizer
        self.model_name = model_name
        try:
            self.parser: ToolCallParser | None = tool_parser_for(self.tokenizer, tool_parser)
        except ConfigError:
            if tool_parser is not None:
                raise
            self.parser = None  # a template without a tool format: plain chat still works
        self.max_sessions = max_sessions
        self.idle_ttl_s = idle_ttl_s
        self.sessions: dict[str, Session] = {}
        self._chats: dict[str, ChatFormat] = {}

    def open(self, *, max_turns: int | None = None, max_total_tokens: int | None = None) -> Session:
        """A new session (its ``key`` is its harness's credential); refused past ``max_sessions``."""
        self._forget_idle()
        if len(self.sessions) >= self.max_sessions:
            error = ConfigError(
                f"the gateway holds {self.max_sessions} sessions already, its most: close finished ones "
                f"(DELETE /v1/sessions/{{id}}); a session idle for {self.idle_ttl_s:g} s is forgotten",
                error_code="too_many_sessions",
            )
            error.http_status = 429
            raise error
        session = Session.new(max_turns=max_turns, max_total_tokens=max_total_tokens)
        # Opened by an episode (the runner's harness agent): its calls carry the episode's routing key.
        session.route = affinity.current() or affinity.RouteKey(session.id)
        self.sessions[session.id] = session
        return session

    def _forget_idle(self) -> None:
        # A harness that died never DELETEs its session: one idle past the TTL is forgotten.
        cutoff = time.monotonic() - self.idle_ttl_s
        for stale in [sid for sid, s in self.sessions.items() if s.used_at < cutoff and not s.lock.locked()]:
            del self.sessions[stale]

    def key_of(self, session_id: str) -> str | None:
        """The key of the session ``session_id``; None when there is none."""
        session = self.sessions.get(session_id)
        return session.key if session is not None else None

    def sandbox_of(self, session_id: str) -> str | None:
        """The sandbox the session ``session_id`` is bound to (its :attr:`Session.sandbox`); None when none."""
        session = self.sessions.get(session_id)
        return session.sandbox if session is not None else None

    def get(self, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is None:
            raise SessionNotFoundError(f"no session {session_id!r}: create one with POST /v1/sessions")
        return session

    def close(self, session_id: str) -> Session:
        session = self.get(session_id)
        del self.sessions[session_id]
        return session

    def chat(self, tools: Sequence[Mapping[str, Any]] | None) -> ChatFormat:
        key = repr(tools) if tools else ""
        chat = self._chats.get(key)
        if chat is None:
            if len(self._chats) > 64:
                self._chats.clear()
            chat = self._chats[key] = ChatFormat(self.tokenizer, tools=tools)
        return chat

    async def complete(self, session_id: str, body: ChatRequest) -> dict[str, Any]:
        """Answer one chat completion of a session, in OpenAI's shape."""
        entered = time.perf_counter()
        limit = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        params = _params(body, self.reply_tokens(limit))
        session, done = await self.turn(
            session_id, body.messages, body.tools, params, parse_tools=body.tool_choice != "none"
        )
        answer = self._answer(session, body, done)
        answer["session"]["gateway_ms"] = self.account(done, entered)
        return answer

    async def turn(
        self,
        session_id: str,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        params: SamplingParams,
        *,
        parse_tools: bool = True,
    ) -> tuple[Session, Completion]:
        """One model turn of a session, from OpenAI-shaped ``messages`` and ``tools``: what every route
        (chat completions, Anthropic Messages, OpenAI Responses) runs once it has translated its request.
        ``parse_tools=False`` returns the reply's text as it is (``tool_choice`` ``none``)."""
        session = self.get(session_id)
        if tools and self.parser is None:
            raise ConfigError(
                "this model's chat template shows no tool-call format, so tool calls cannot be parsed; "
                "name the parser (--tool-parser hermes, glm45 or llama3_json)"
            )
        async with session.lock:
            with affinity.bound(session.route or affinity.RouteKey(session.id)):
                done = await session.complete(
                    messages,
                    tools,
                    params,
                    policy=self.policy,
                    chat=self.chat(tools),
                    parser=self.parser if parse_tools else None,
                    max_context=self.policy.max_context,
                )
        return session, done

    def reply_tokens(self, asked: int | None) -> int:
        """A reply's token budget: what the request asked, else the policy's whole context (the session
        then cuts it to what the conversation's budget has left, :meth:`Session.complete`)."""
        return asked if asked is not None else (self.policy.max_context or DEFAULT_REPLY_TOKENS)

    @staticmethod
    def session_part(session: Session, done: Completion) -> dict[str, Any]:
        """The ``session`` object of every route's answer: which session, its segment, and whether this
        turn started a new one (and why)."""
        return {
            "id": session.id,
            "segment": len(session.segment_starts) - 1,
            "new_segment": done.turn.new_segment,
            "segment_reason": done.turn.segment_reason,
        }

    @staticmethod
    def account(done: Completion, entered: float) -> float:
        """Record the gateway's own cost of a turn that entered at ``entered`` (``perf_counter``): rendering,
        matching, parsing, the answer, the model's time excluded. Returns it in ms, for the answer."""
        done.turn.gateway_s = max(0.0, time.perf_counter() - entered - done.turn.model_s)
        return round(done.turn.gateway_s * 1000, 3)

    def _answer(self, session: Session, body: ChatRequest, done: Completion) -> dict[str, Any]:
        g = done.generation
        choice: dict[str, Any] = {
            "index": 0,
            "message": done.reply,
            "logprobs": chat_logprobs(self.policy, g, False) if body.logprobs else None,
            "finish_reason": done.finish_reason,
        }
        answer: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.model or self.model_name,
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(done.prompt_ids),
                "completion_tokens": len(g.output_ids),
                "total_tokens": len(done.prompt_ids) + len(g.output_ids),
                "prompt_tokens_details": {"cached_tokens": g.cached_tokens},
            },
            "weight_version": g.weight_version,
            "session": self.session_part(session, done),
        }
        if body.return_token_ids:
            choice["token_ids"] = g.output_ids
            answer["prompt_token_ids"] = done.prompt_ids
        return answer


class ChatRequest(BaseModel):
    """A session's chat completion request (OpenAI's fields; unknown labels are accepted and ignored)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    return_token_ids: bool = False
    stream: bool = False
    stream_options: dict[str, Any] | None = None


def _params(body: ChatRequest, max_new_tokens: int) -> SamplingParams:
    if body.n != 1:
        raise ConfigError(f"n must be 1 in a session (one conversation), got {body.n}")
    if body.tool_choice not in (None, "auto", "none"):
        raise ConfigError(
            f"tool_choice={body.tool_choice!r} is not served (it needs constrained decoding); use 'auto' or 'none'"
        )
    return openai_sampling(body, max_new_tokens, top_logprobs=(body.top_logprobs or 0) if body.logprobs else 0)


harness_router = APIRouter(prefix="/v1/sessions")
"""A session's own routes, what its harness calls (behind its key)."""
router = APIRouter(prefix="/v1/sessions")
"""The routes that open, read and close sessions (``sandrl serve inference``, beside :data:`harness_router`)."""


def gateway_of(request: Request) -> Gateway:
    gateway = getattr(request.app.state, "gateway", None)
    if not isinstance(gateway, Gateway):
        raise ConfigError("this server runs no session gateway (its model has no tokenizer)")
    return gateway


class OpenRequest(BaseModel):
    """``POST /v1/sessions``'s optional body: the session's budget."""

    model_config = ConfigDict(extra="forbid")

    max_turns: int | None = None
    max_total_tokens: int | None = None


@router.post("")
async def open_session(request: Request, body: OpenRequest | None = None) -> dict[str, Any]:
    limits = body or OpenRequest()
    session = gateway_of(request).open(max_turns=limits.max_turns, max_total_tokens=limits.max_total_tokens)
    base_url = f"{str(request.base_url).rstrip('/')}/v1/sessions/{session.id}"
    return {"id": session.id, "base_url": base_url, "api_key": session.key}


@harness_router.post("/{session_id}/chat/completions")
@harness_router.post("/{session_id}/v1/chat/completions")
async def chat_completions(session_id: str, body: ChatRequest, request: Request) -> Any:
    usage = include_usage(body.stream, body.stream_options)
    answer = await gateway_of(request).complete(session_id, body)
    return stream_response(answer, usage=usage) if body.stream else answer


@harness_router.get("/{session_id}/models")
@harness_router.get("/{session_id}/v1/models")
async def models(session_id: str, request: Request) -> dict[str, Any]:
    gateway = gateway_of(request)
    gateway.get(session_id)
    name = gateway.model_name
    # OpenAI's list, with Anthropic's fields beside it: both clients look models up at {base_url}/v1/models.
    entry = {"id": name, "object": "model", "created": 0, "owned_by": "sandrl", "type": "model", "display_name": name}
    return {"object": "list", "data": [entry], "has_more": False, "first_id": name, "last_id": name}


@router.get("/{session_id}")
async def session_record(session_id: str, request: Request) -> dict[str, Any]:
    return gateway_of(request).get(session_id).record()


@router.delete("/{session_id}")
async def close_session(session_id: str, request: Request) -> dict[str, Any]:
    return gateway_of(request).close(session_id).record()


def create_gateway_app(gateway: Gateway, *, max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    """The runner's gateway: a session's own routes, behind its key, on loopback (see the module docstring).

    Sessions are opened in-process (:meth:`Gateway.open`); the app has no route that opens, lists,
    reads or closes one."""
    app = FastAPI(title="sandrl session gateway", openapi_url=None, docs_url=None, redoc_url=None)
    app.state.gateway = gateway
    app.include_router(harness_router)
    install_error_handlers(
        app,
        not_found_hint="the session gateway serves /v1/sessions/{id}/chat/completions, /responses, /v1/messages "
        "and /models",
    )
    install_guards(
        app,
        token=None,
        key_of=gateway.key_of,
        sandbox_of=gateway.sandbox_of,
        max_body_bytes=max_body_bytes,
        advice="the session gateway serves the harnesses of its run's episodes, on this machine only",
    )
    return app
