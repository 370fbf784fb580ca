"""Bearer-token auth and body-size limits of the sandbox service, as plain ASGI middleware.

The token is read from a file (``--token-file``) or the ``SANDRL_TOKEN`` environment
variable, never from the command line (where ``ps`` shows it to every user). Requests carry
``Authorization: Bearer <token>``; the comparison is constant-time. A credential in the
query string is refused whatever its value, since URLs end up in logs. ``/healthz`` is the
only open route. Without a token the server has no auth, so :func:`bind_host` keeps it on
loopback, and :class:`LoopbackOnly` refuses what loopback alone does not keep out: a page in a
local browser, whose requests reach 127.0.0.1 through DNS rebinding (with the page's own name
in ``Host``) or carry an ``Origin``.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from fastapi import HTTPException

from sandrl.errors import ConfigError

TOKEN_ENV = "SANDRL_TOKEN"
OPEN_PATHS = frozenset({"/healthz"})
QUERY_CREDENTIALS = frozenset({"token", "access_token", "api_key", "apikey", "key", "auth", "authorization"})

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Any]
Send = Callable[[Message], Any]
ASGIApp = Callable[[Scope, Receive, Send], Any]


def load_token(token_file: Path | str | None = None, env: Mapping[str, str] | None = None) -> str | None:
    """The service token from ``token_file`` if given, else from ``$SANDRL_TOKEN``; None when neither is set."""
    env = os.environ if env is None else env
    if token_file is not None:
        path = Path(token_file)
        try:
            token = path.read_text().strip()
        except OSError as exc:
            raise ConfigError(f"cannot read the token file {path}: {exc.strerror or exc}") from exc
        if not token:
            raise ConfigError(f"the token file {path} is empty: write a long random token in it")
        return _checked(token, str(path))
    token = env.get(TOKEN_ENV, "").strip()
    return _checked(token, f"${TOKEN_ENV}") if token else None


def _checked(token: str, where: str) -> str:
    if len(token) < 16:
        raise ConfigError(
            f"the token in {where} is {len(token)} characters; use at least 16 (e.g. `openssl rand -hex 32`)"
        )
    if not token.isascii() or any(c.isspace() or not c.isprintable() for c in token):
        raise ConfigError(f"the token in {where} must be printable ASCII without spaces")
    return token


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def loopback_host(header: str) -> bool:
    """Whether a ``Host`` header names loopback: ``localhost``, 127.0.0.0/8 or ``[::1]``, with or without a port."""
    host = header.strip().lower()
    if host.startswith("["):
        address, bracket, rest = host[1:].partition("]")
        if not bracket or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return False
        return address == "::1"
    name, colon, port = host.partition(":")
    if colon and not port.isdigit():
        return False
    return is_loopback(name)


def bind_host(host: str, token: str | None) -> tuple[str, str | None]:
    """The address to bind and a warning to print: without a token only loopback is served."""
    if token is not None:
        return host, None
    if is_loopback(host):
        return host, f"no token configured: serving {host} (loopback) only, without auth"
    return "127.0.0.1", (
        f"no token configured: refusing to serve {host} without auth and binding 127.0.0.1 only; "
        f"put a token in ${TOKEN_ENV} or a file passed with --token-file to serve other hosts"
    )


def error_response(status: int, error_code: str, message: str, headers: Mapping[str, str] | None = None) -> Message:
    body = json.dumps({"code": status, "error_code": error_code, "message": message}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    return {"start": {"type": "http.response.start", "status": status, "headers": raw}, "body": body}


async def send_error(send: Send, status: int, error_code: str, message: str, **headers: str) -> None:
    response = error_response(status, error_code, message, headers)
    await send(response["start"])
    await send({"type": "http.response.body", "body": response["body"]})


class BearerAuth:
    """Refuses every request but to :data:`OPEN_PATHS` without the right bearer token (401 unauthorized)."""

    def __init__(self, app: ASGIApp, *, token: str | None, on_refused: Callable[[str], None] | None = None) -> None:
        self.app = app
        self._token = token.encode() if token is not None else None
        self._on_refused = on_refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        problem = self._problem(scope)
        if problem is None:
            await self.app(scope, receive, send)
            return
        if self._on_refused is not None:
            self._on_refused("unauthorized")
        await send_error(send, 401, "unauthorized", problem, **{"WWW-Authenticate": 'Bearer realm="sandrl"'})

    def _problem(self, scope: Scope) -> str | None:
        query = scope.get("query_string", b"").decode("latin-1")
        names = {name.lower() for name, _ in parse_qsl(query, keep_blank_values=True)}
        if names & QUERY_CREDENTIALS:
            return (
                "credentials in the query string are refused (URLs end up in logs): "
                "send the token as an 'Authorization: Bearer <token>' header instead"
            )
        if self._token is None:
            return None
        header = b""
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                header = value
                break
        scheme, _, given = header.partition(b" ")
        if not header:
            return "this server needs a token: send 'Authorization: Bearer <token>' (the token is in $SANDRL_TOKEN)"
        if scheme.lower() != b"bearer" or not hmac.compare_digest(given.strip(), self._token):
            return (
                "the token is wrong: send 'Authorization: Bearer <token>' with the token the server was started "
                "with ($SANDRL_TOKEN or --token-file)"
            )
        return None


class LoopbackOnly:
    """For a server without a token: refuses requests not addressed to a loopback name, and any from a browser.

    Without a token, being reachable on loopback is the only credential, which a web page in a
    local browser also has: through DNS rebinding its requests reach 127.0.0.1 carrying the
    page's own host name, and a browser sends ``Origin`` on every cross-site request (and on
    same-origin ones that are not GET/HEAD). No sandrl client sends ``Origin``.
    """

    def __init__(self, app: ASGIApp, *, on_refused: Callable[[str], None] | None = None) -> None:
        self.app = app
        self._on_refused = on_refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = origin = None
        for name, value in scope.get("headers", []):
            if name == b"host":
                host = value.decode("latin-1")
            elif name == b"origin":
                origin = value.decode("latin-1")
        if origin is not None:
            problem = (
                "forbidden_origin",
                f"requests from a web page (Origin: {origin[:100]}) are refused by a server without a token; "
                "use sandrl's client or the e2b SDK, or start the server with a token ($SANDRL_TOKEN)",
            )
        elif host is None or not loopback_host(host):
            problem = (
                "forbidden_host",
                f"this server has no token and answers only requests addressed to loopback "
                f"(Host: localhost, 127.0.0.1 or [::1]), not {(host or '(none)')[:100]!r}: connect to "
                "http://127.0.0.1:PORT, or start the server with a token ($SANDRL_TOKEN) to serve other names",
            )
        else:
            await self.app(scope, receive, send)
            return
        if self._on_refused is not None:
            self._on_refused(problem[0])
        await send_error(send, 403, *problem)


class BodyLimit:
    """Refuses request bodies over a limit with 413 payload_too_large; ``limit_for(path)`` picks the limit.

    A declared Content-Length over the limit is refused before the app runs; a chunked body is
    counted as it arrives and cut off once over.
    """

    def __init__(self, app: ASGIApp, *, limit_for: Callable[[str], int]) -> None:
        self.app = app
        self.limit_for = limit_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope.get("path", ""))
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = content_length(value.decode("latin-1"))
                except ValueError as exc:
                    await send_error(send, 400, "invalid_request", str(exc))
                    return
                if declared is not None and declared > limit:
                    await send_error(send, 413, "payload_too_large", too_large(limit))
                    return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message: Message = await receive()
            if message.get("type") == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise PayloadTooLarge(too_large(limit))
            return message

        await self.app(scope, counted, send)


def content_length(value: str | None) -> int | None:
    """A Content-Length header's value as a number; None when there is none (a chunked body).

    Raises ValueError (its message fit for a 400 answer) when the value is not a number of bytes.
    """
    if value is None:
        return None
    if not value.strip().isdigit():
        raise ValueError("the Content-Length header is not a number")
    return int(value)


def too_large(limit: int) -> str:
    return (
        f"the request body is over this route's limit of {limit} bytes: send large files with "
        "PUT /v1/sandboxes/{id}/files (streamed), or raise the server's limit"
    )


class PayloadTooLarge(HTTPException):
    """Raised from the body stream of a request over its size limit (answered 413 by the app)."""

    def __init__(self, message: str) -> None:
        super().__init__(413, detail=message)
