"""Who may call the inference server and the session gateway; how big a request may be.

Built from :mod:`sandrl.http_auth` (the sandbox service's pieces), with these rules:

- **The server's token** (``sandrl serve inference --token-file FILE``, or
  ``$SANDRL_INFERENCE_TOKEN``): with one, every route but ``/health`` and ``/health_generate``
  (open, as SGLang's ``--api-key`` leaves them) needs ``Authorization: Bearer <token>``, which is
  what SGLang's and vLLM's clients send for their ``--api-key``. Without one, the server binds
  loopback only and answers only requests addressed to a loopback name and sent by no web page
  (:class:`~sandrl.http_auth.LoopbackOnly`).
- **Control routes** (:data:`CONTROL_PATHS`: weights, LoRA adapters, pause and continue, abort, flush, memory)
  always need the token: a server started without one refuses them (403 ``token_required``), so
  a local process that can reach the port cannot swap the weights or stall generation.
- **Session routes** (``/v1/sessions/{id}`` and below) take that session's own key, which its
  opener was given (``api_key``), or the server's token: one session's key cannot read, write
  or close another session. There, and only there, the key may also come as ``x-api-key``, the
  header the Anthropic clients send an API key in (Claude Code with ``ANTHROPIC_API_KEY``; with
  ``ANTHROPIC_AUTH_TOKEN`` it sends ``Authorization: Bearer``); every other route takes only the bearer.
- **Sandboxes** (the runner's gateway, given ``sandbox_of``): a request relayed through a sandbox's
  port forward (:mod:`sandrl.peer_tags` says whose) reaches only the session bound to that sandbox
  (a CLI agent's, bound when its forward opens), and a bound session answers only to its sandbox
  (403 ``wrong_sandbox``): a policy's commands cannot use another episode's session, even with its key.
- **Body limit**: a request body over ``max_body_bytes`` (:data:`MAX_BODY_BYTES`) is refused
  with 413 before it is read (a chunked one once it passes the limit), so a client cannot grow
  the process (the gateway of ``sandrl train`` runs on the trainer's own event loop).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path

from fastapi import FastAPI

from sandrl import http_auth
from sandrl.errors import ConfigError
from sandrl.http_auth import (
    ASGIApp,
    Receive,
    Scope,
    Send,
    bearer,
    header,
    query_credentials,
    same_token,
    send_error,
    send_unauthorized,
)
from sandrl.inference.http_errors import AnthropicErrorShape
from sandrl.peer_tags import tag_of_peer

TOKEN_ENV = "SANDRL_INFERENCE_TOKEN"
"""Where ``sandrl serve inference`` and sandrl's inference clients read the token when no file is named."""
MAX_BODY_BYTES = 16 * 2**20
"""The default limit of a request body: a harness's whole history at a million tokens fits, twice."""
OPEN_PATHS = frozenset({"/health", "/health_generate"})
CONTROL_PATHS = frozenset(
    {
        "/update_weights_from_disk",
        "/update_weights_from_tensor",
        "/update_weights_from_distributed",
        "/update_weights_from_ipc",
        "/init_weights_update_group",
        "/destroy_weights_update_group",
        "/update_weight_version",
        "/pause_generation",
        "/continue_generation",
        "/abort_request",
        "/flush_cache",
        "/release_memory_occupation",
        "/resume_memory_occupation",
        "/load_lora_adapter",
        "/unload_lora_adapter",
    }
)
"""Routes that change what the server serves, or stop it serving: never open, whatever the server's setup."""
SESSION_PATH = re.compile(r"^/v1/sessions/([^/]+)(?:/.*)?$")
HOW_TO_SET = f"start the server with --token-file FILE (or ${TOKEN_ENV})"

KeyOf = Callable[[str], str | None]
SandboxOf = Callable[[str], str | None]
"""The id of the sandbox a session is bound to (None: none), by session id."""
"""A session's key by its id (None: no such session)."""


def load_token(token_file: Path | str | None = None, env: Mapping[str, str] | None = None) -> str | None:
    """The server's token from ``token_file`` if given, else from ``$SANDRL_INFERENCE_TOKEN``; None when neither is."""
    return http_auth.load_token(token_file, env, env_var=TOKEN_ENV)


def load_client_token(token_file: Path | str | None = None, env: Mapping[str, str] | None = None) -> str | None:
    """The token a client sends: from ``token_file`` (``[model] token_file``), else ``$SANDRL_INFERENCE_TOKEN``.

    Any length: it is the key some server was started with (an SGLang ``--api-key`` may be short).
    """
    return http_auth.load_token(token_file or None, env, env_var=TOKEN_ENV, min_length=1)


def bind_host(host: str, token: str | None) -> tuple[str, str | None]:
    """The address to bind and a warning to print: without a token only loopback is served."""
    return http_auth.bind_host(host, token, how_to_set=HOW_TO_SET)


def session_of(path: str) -> str | None:
    """The session id a path is under (``/v1/sessions/{id}...``), or None."""
    match = SESSION_PATH.match(path)
    return match.group(1) if match else None


class InferenceAuth:
    """The token, control-route and session-key rules of the module docstring, in front of an app."""

    def __init__(self, app: ASGIApp, *, token: str | None, key_of: KeyOf, sandbox_of: SandboxOf | None = None) -> None:
        self.app = app
        self._token = token
        self._key_of = key_of
        self._sandbox_of = sandbox_of

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        refused = query_credentials(scope)
        if refused is not None:
            await send_unauthorized(send, refused)
            return
        given = bearer(scope)
        session = session_of(path)
        if session is not None:
            if self._sandbox_of is not None:
                came_from, bound = _sandbox_of_client(scope), self._sandbox_of(session)
                if (came_from is not None or bound is not None) and came_from != bound:
                    await send_error(
                        send,
                        403,
                        "wrong_sandbox",
                        f"session {session[:64]!r} answers only to the sandbox of its episode, through that "
                        "sandbox's forwarded port",
                    )
                    return
            key = self._key_of(session)
            offered = (given, header(scope, b"x-api-key"))
            if not any(same_token(g, self._token) or same_token(g, key) for g in offered):
                await send_unauthorized(
                    send,
                    f"session {session[:64]!r}: its routes need its own key, sent as 'Authorization: Bearer <key>' "
                    "(an OpenAI client's api_key) or 'x-api-key: <key>' (an Anthropic client's): the api_key the "
                    "session's opener was given",
                )
                return
        elif path in OPEN_PATHS:
            pass
        elif self._token is None:
            if path in CONTROL_PATHS:
                await send_error(
                    send,
                    403,
                    "token_required",
                    f"{path} changes what this server serves and needs a token, and this server was started without "
                    f"one: {HOW_TO_SET}, and give its clients the same token ([model] token_file, or "
                    f"${TOKEN_ENV}); they send it as 'Authorization: Bearer <token>'",
                )
                return
        elif not same_token(given, self._token):
            await send_unauthorized(
                send,
                "this server needs its token: send 'Authorization: Bearer <token>' with the token it was started "
                f"with (--token-file or ${TOKEN_ENV}; sandrl's clients: [model] token_file)",
            )
            return
        await self.app(scope, receive, send)


def _sandbox_of_client(scope: Scope) -> str | None:
    """The sandbox whose port forward relayed this request (None: a client that came no such way)."""
    client = scope.get("client")
    return tag_of_peer(str(client[0]), int(client[1])) if client else None


def install_guards(
    app: FastAPI,
    *,
    token: str | None,
    key_of: KeyOf,
    max_body_bytes: int,
    advice: str,
    sandbox_of: SandboxOf | None = None,
) -> None:
    """Put ``app`` behind the rules of the module docstring: outermost loopback only (without a token), then
    the token and session keys, then the body limit. ``advice`` ends a loopback refusal. Their refusals on
    a session's Anthropic routes are said in Anthropic's shape (:class:`AnthropicErrorShape`, outside them all)."""
    if max_body_bytes < 1:
        raise ConfigError(f"max_body_bytes must be >= 1, got {max_body_bytes}")

    def too_large(limit: int) -> str:
        return f"the request body is over this server's limit of {limit} bytes: send less, or raise the limit"

    app.add_middleware(http_auth.BodyLimit, limit_for=lambda _path: max_body_bytes, too_large=too_large)
    app.add_middleware(InferenceAuth, token=token, key_of=key_of, sandbox_of=sandbox_of)
    if token is None:
        app.add_middleware(http_auth.LoopbackOnly, advice=advice)
    app.add_middleware(AnthropicErrorShape)
