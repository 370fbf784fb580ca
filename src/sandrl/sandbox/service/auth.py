"""The sandbox service's bearer-token auth and body limits: :mod:`sandrl.http_auth` with the service's settings.

The token is read from a file (``--token-file``) or the ``SANDRL_TOKEN`` environment variable,
never from the command line. ``/healthz`` is the only open route. Without a token the server has
no auth, so :func:`bind_host` keeps it on loopback and :class:`LoopbackOnly` refuses requests
addressed to other names or sent by a web page (see :mod:`sandrl.http_auth` for why).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from sandrl import http_auth
from sandrl.http_auth import (
    QUERY_CREDENTIALS,
    ASGIApp,
    Message,
    PayloadTooLarge,
    Receive,
    Scope,
    Send,
    content_length,
    error_response,
    is_loopback,
    loopback_host,
    send_error,
)
from sandrl.sandbox.remote.wire import TOKEN_ENV

__all__ = [  # what the service's modules import from here
    "OPEN_PATHS",
    "QUERY_CREDENTIALS",
    "TOKEN_ENV",
    "ASGIApp",
    "BearerAuth",
    "BodyLimit",
    "LoopbackOnly",
    "Message",
    "PayloadTooLarge",
    "Receive",
    "Scope",
    "Send",
    "bind_host",
    "content_length",
    "error_response",
    "is_loopback",
    "load_token",
    "loopback_host",
    "send_error",
    "too_large",
]

OPEN_PATHS = frozenset({"/healthz"})
TOKEN_SOURCE = f"${TOKEN_ENV} or --token-file"


def load_token(token_file: Path | str | None = None, env: Mapping[str, str] | None = None) -> str | None:
    """The service token from ``token_file`` if given, else from ``$SANDRL_TOKEN``; None when neither is set."""
    return http_auth.load_token(token_file, env, env_var=TOKEN_ENV)


def bind_host(host: str, token: str | None) -> tuple[str, str | None]:
    """The address to bind and a warning to print: without a token only loopback is served."""
    how = f"put a token in ${TOKEN_ENV} or a file passed with --token-file"
    return http_auth.bind_host(host, token, how_to_set=how)


class BearerAuth(http_auth.BearerAuth):
    """Refuses every request but to :data:`OPEN_PATHS` without the service's bearer token (401 unauthorized)."""

    def __init__(self, app: ASGIApp, *, token: str | None, on_refused: Callable[[str], None] | None = None) -> None:
        super().__init__(app, token=token, source=TOKEN_SOURCE, open_paths=OPEN_PATHS, on_refused=on_refused)


class LoopbackOnly(http_auth.LoopbackOnly):
    """For the service without a token: only requests addressed to loopback, none from a browser."""

    def __init__(self, app: ASGIApp, *, on_refused: Callable[[str], None] | None = None) -> None:
        super().__init__(
            app,
            advice=(
                "this server has no token: use sandrl's client or the e2b SDK on this machine, or start the server "
                f"with a token (${TOKEN_ENV} or --token-file) to serve other names"
            ),
            on_refused=on_refused,
        )


class BodyLimit(http_auth.BodyLimit):
    """Refuses request bodies over ``limit_for(path)`` with 413 payload_too_large (see :mod:`sandrl.http_auth`)."""

    def __init__(self, app: ASGIApp, *, limit_for: Callable[[str], int]) -> None:
        super().__init__(app, limit_for=limit_for, too_large=too_large)


def too_large(limit: int) -> str:
    return (
        f"the request body is over this route's limit of {limit} bytes: send large files with "
        "PUT /v1/sandboxes/{id}/files (streamed), or raise the server's limit"
    )
