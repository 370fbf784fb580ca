"""Bearer tokens, loopback-only serving and body limits for sandrl's HTTP servers, as plain ASGI middleware.

The sandbox service (:mod:`sandrl.sandbox.service.auth`), the inference server and the session
gateway (:mod:`sandrl.inference.auth`) are guarded by the same pieces; each server names its own
open routes, where its token comes from, and its limits.

- A token is read from a file or an environment variable, never from the command line (where
  ``ps`` shows it to every user). Requests carry ``Authorization: Bearer <token>``, compared in
  constant time; a credential in the query string is refused whatever its value, since URLs end
  up in logs.
- Without a token a server has no auth, so :func:`bind_host` keeps it on loopback, and
  :class:`LoopbackOnly` refuses what loopback alone does not keep out: a page in a local browser,
  whose requests reach 127.0.0.1 through DNS rebinding (with the page's own name in ``Host``) or
  carry an ``Origin``.
- :class:`BodyLimit` refuses a body over the route's limit before it is read when its
  ``Content-Length`` says so, and counts a chunked one as it arrives: a client cannot make the
  server buffer more than the limit.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
import secrets
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from fastapi import HTTPException

from sandrl.errors import ConfigError

QUERY_CREDENTIALS = frozenset({"token", "access_token", "api_key", "apikey", "key", "auth", "authorization"})
MIN_TOKEN_CHARS = 16

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Any]
Send = Callable[[Message], Any]
ASGIApp = Callable[[Scope, Receive, Send], Any]


def load_token(
    token_file: Path | str | None,
    env: Mapping[str, str] | None = None,
    *,
    env_var: str,
    min_length: int = MIN_TOKEN_CHARS,
) -> str | None:
    """The token from ``token_file`` if given, else from ``$env_var``; None when neither is set.

    ``min_length``: a server's own token must be long (16 characters); a client reading the key
    another server was started with (an SGLang ``--api-key``) takes whatever that key is.
    """
    env = os.environ if env is None else env
    if token_file is not None:
        path = Path(token_file)
        try:
            token = path.read_text().strip()
        except OSError as exc:
            raise ConfigError(f"cannot read the token file {path}: {exc.strerror or exc}") from exc
        if not token:
            raise ConfigError(f"the token file {path} is empty: write a long random token in it")
        return check_token(token, str(path), min_length=min_length)
    token = env.get(env_var, "").strip()
    return check_token(token, f"${env_var}", min_length=min_length) if token else None


def check_token(token: str, where: str, *, min_length: int = MIN_TOKEN_CHARS) -> str:
    """``token`` if it is long enough and fits in a header; a ConfigError naming ``where`` otherwise."""
    if len(token) < min_length:
        raise ConfigError(
            f"the token in {where} is {len(token)} characters; use at least {min_length} (e.g. `openssl rand -hex 32`)"
        )
    if not token.isascii() or any(c.isspace() or not c.isprintable() for c in token):
        raise ConfigError(f"the token in {where} must be printable ASCII without spaces")
    return token


def new_token() -> str:
    """A fresh random token (256 bits), for a server a sandrl command starts for itself."""
    return secrets.token_urlsafe(32)


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


def bind_host(host: str, token: str | None, *, how_to_set: str) -> tuple[str, str | None]:
    """The address to bind and a warning to print: without a token only loopback is served.

    ``how_to_set`` tells the user where this server reads its token from."""
    if token is not None:
        return host, None
    if is_loopback(host):
        return host, f"no token configured: serving {host} (loopback) only, without auth"
    return "127.0.0.1", (
        f"no token configured: refusing to serve {host} without auth and binding 127.0.0.1 only; "
        f"{how_to_set} to serve other hosts"
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


async def send_unauthorized(send: Send, message: str) -> None:
    await send_error(send, 401, "unauthorized", message, **{"WWW-Authenticate": 'Bearer realm="sandrl"'})


def header(scope: Scope, name: bytes) -> bytes | None:
    """The first value of the (lower-case) header ``name``, or None."""
    for key, value in scope.get("headers", []):
        if key == name:
            return bytes(value)
    return None


def query_credentials(scope: Scope) -> str | None:
    """The refusal of a request with a credential in its query string, or None."""
    query = scope.get("query_string", b"").decode("latin-1")
    names = {name.lower() for name, _ in parse_qsl(query, keep_blank_values=True)}
    if names & QUERY_CREDENTIALS:
        return (
            "credentials in the query string are refused (URLs end up in logs): "
            "send the token as an 'Authorization: Bearer <token>' header instead"
        )
    return None


def bearer(scope: Scope) -> bytes | None:
    """The token of an ``Authorization: Bearer <token>`` header; None without one (or with another scheme)."""
    value = header(scope, b"authorization")
    if value is None:
        return None
    scheme, _, given = value.partition(b" ")
    return given.strip() if scheme.lower() == b"bearer" and given.strip() else None


def same_token(given: bytes | None, expected: bytes | str | None) -> bool:
    """Whether ``given`` is ``expected``, compared in constant time (never equal when either is missing)."""
    if given is None or expected is None:
        return False
    return hmac.compare_digest(given, expected.encode() if isinstance(expected, str) else expected)


class BearerAuth:
    """Refuses every request but to ``open_paths`` without the right bearer token (401 unauthorized).

    ``source`` tells a refused client where the server's token is (``$SANDRL_TOKEN or --token-file``).
    Without a token only credentials in the query string are refused.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        token: str | None,
        source: str,
        open_paths: frozenset[str] = frozenset(),
        on_refused: Callable[[str], None] | None = None,
    ) -> None:
        self.app = app
        self._token = token.encode() if token is not None else None
        self._source = source
        self._open_paths = open_paths
        self._on_refused = on_refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in self._open_paths:
            await self.app(scope, receive, send)
            return
        problem = self._problem(scope)
        if problem is None:
            await self.app(scope, receive, send)
            return
        if self._on_refused is not None:
            self._on_refused("unauthorized")
        await send_unauthorized(send, problem)

    def _problem(self, scope: Scope) -> str | None:
        refused = query_credentials(scope)
        if refused is not None or self._token is None:
            return refused
        if header(scope, b"authorization") is None:
            return f"this server needs a token: send 'Authorization: Bearer <token>' (the token: {self._source})"
        if not same_token(bearer(scope), self._token):
            return (
                "the token is wrong: send 'Authorization: Bearer <token>' with the token the server was started "
                f"with ({self._source})"
            )
        return None


class LoopbackOnly:
    """Refuses requests not addressed to a loopback name, and any from a browser (403).

    For a server that has no token, or whose callers are all local: being reachable on loopback is
    then the only credential, which a web page in a local browser also has. Through DNS rebinding
    its requests reach 127.0.0.1 carrying the page's own host name, and a browser sends ``Origin``
    on every cross-site request (and on same-origin ones that are not GET/HEAD). No sandrl client
    sends ``Origin``. ``advice`` ends the refusal: how to serve more than this.
    """

    def __init__(self, app: ASGIApp, *, advice: str, on_refused: Callable[[str], None] | None = None) -> None:
        self.app = app
        self._advice = advice
        self._on_refused = on_refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        problem = loopback_problem(scope, self._advice)
        if problem is None:
            await self.app(scope, receive, send)
            return
        if self._on_refused is not None:
            self._on_refused(problem[0])
        await send_error(send, 403, *problem)


def loopback_problem(scope: Scope, advice: str) -> tuple[str, str] | None:
    """``(error_code, message)`` when a request is not addressed to loopback or comes from a web page."""
    host, origin = header(scope, b"host"), header(scope, b"origin")
    if origin is not None:
        return (
            "forbidden_origin",
            f"requests from a web page (Origin: {origin.decode('latin-1')[:100]}) are refused here; {advice}",
        )
    name = host.decode("latin-1") if host is not None else None
    if name is None or not loopback_host(name):
        return (
            "forbidden_host",
            "only requests addressed to loopback (Host: localhost, 127.0.0.1 or [::1]) are answered here, not "
            f"{(name or '(none)')[:100]!r}: connect to http://127.0.0.1:PORT; {advice}",
        )
    return None


class BodyLimit:
    """Refuses request bodies over a limit with 413 payload_too_large; ``limit_for(path)`` picks the limit.

    A declared Content-Length over the limit is refused before the app runs (nothing of the body
    is read); a chunked body is counted as it arrives and cut off once over. ``too_large(limit)``
    is the refusal's message.
    """

    def __init__(self, app: ASGIApp, *, limit_for: Callable[[str], int], too_large: Callable[[int], str]) -> None:
        self.app = app
        self.limit_for = limit_for
        self.too_large = too_large

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope.get("path", ""))
        declared_header = header(scope, b"content-length")
        if declared_header is not None:
            try:
                declared = content_length(declared_header.decode("latin-1"))
            except ValueError as exc:
                await send_error(send, 400, "invalid_request", str(exc))
                return
            if declared is not None and declared > limit:
                await send_error(send, 413, "payload_too_large", self.too_large(limit))
                return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message: Message = await receive()
            if message.get("type") == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise PayloadTooLarge(self.too_large(limit))
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


class PayloadTooLarge(HTTPException):
    """Raised from the body stream of a request over its size limit (answered 413 by the app)."""

    def __init__(self, message: str) -> None:
        super().__init__(413, detail=message)
