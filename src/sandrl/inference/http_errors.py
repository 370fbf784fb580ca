"""The error bodies of sandrl's inference HTTP apps (the server and the session gateway).

Everywhere ``{code, error_code, message}``; then the shape of the vendor whose client calls the route:

- **Anthropic's** on a session's Anthropic routes (``/v1/sessions/{id}/v1/messages`` and its
  ``/count_tokens``): ``{"type": "error", "error": {"type": "invalid_request_error", "message": ...,
  "details": {"error_code": ...}}}``, the type chosen by the status as Anthropic's API chooses it
  (:data:`ANTHROPIC_TYPES`); the ``anthropic`` package raises its typed error from the status and reads
  ``error.message``, ``error.type`` and ``error.details.error_code``. The guards' refusals (a wrong key,
  a body over the limit, a caller not on loopback), answered before the app runs, are re-said in
  that shape by :class:`AnthropicErrorShape`.
- **OpenAI's** on every other ``/v1/...`` route: the ``error`` object the ``openai`` package reads its
  message from.
"""

from __future__ import annotations

import json
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from sandrl.errors import SandrlError
from sandrl.http_auth import ASGIApp, Message, Receive, Scope, Send

ANTHROPIC_PATH = re.compile(r"^/v1/sessions/[^/]+/v1/messages(?:/|$)")
"""A session's Anthropic routes: the ``anthropic`` package appends ``/v1/messages`` to the session's ``base_url``.
(``{base_url}/v1/models`` answers both vendors' clients, and its errors are OpenAI's.)"""
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}
"""Anthropic's error type by HTTP status (its API's table); another 4xx is an invalid request, another 5xx an
API error."""


def is_anthropic(path: str) -> bool:
    """Whether ``path`` is one of a session's Anthropic routes, answered in Anthropic's error shape."""
    return ANTHROPIC_PATH.match(path) is not None


def anthropic_error(status: int, error_code: str, message: str) -> dict[str, Any]:
    """Anthropic's error body, with sandrl's ``{code, error_code, message}`` beside it."""
    kind = ANTHROPIC_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    error = {"type": kind, "message": message, "details": {"error_code": error_code}}
    return {"type": "error", "error": error, "code": status, "error_code": error_code, "message": message}


def error_body(
    status: int, error_code: str, message: str, *, openai: bool, anthropic: bool = False, param: str | None = None
) -> JSONResponse:
    """sandrl's error body ``{code, error_code, message}``; on OpenAI routes also the ``error`` object
    the official ``openai`` package reads its message from (``param``: the request field it refuses, when the
    error names one), on Anthropic routes Anthropic's shape."""
    if anthropic:
        return JSONResponse(anthropic_error(status, error_code, message), status_code=status)
    body: dict[str, Any] = {"code": status, "error_code": error_code, "message": message}
    if openai:
        body["error"] = {"message": message, "type": error_code, "param": param, "code": error_code}
    return JSONResponse(body, status_code=status)


def install_error_handlers(app: FastAPI, *, not_found_hint: str) -> None:
    """sandrl's error bodies on ``app``: typed errors with their status, bad requests as 400, the rest as 500."""

    def respond(request: Request, status: int, error_code: str, message: str, param: str | None = None) -> JSONResponse:
        path = request.url.path
        return error_body(
            status, error_code, message, openai=path.startswith("/v1/"), anthropic=is_anthropic(path), param=param
        )

    @app.exception_handler(SandrlError)
    async def sandrl_error(request: Request, exc: SandrlError) -> JSONResponse:
        param = getattr(exc, "param", None)  # a refusal that names its field (the Responses route's RefusedField)
        return respond(request, exc.http_status, exc.error_code, exc.message, param if isinstance(param, str) else None)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err.get('loc', ()) if p != 'body') or 'body'}: {err.get('msg')}"
            for err in exc.errors()
        )
        return respond(request, 400, "invalid_request", f"invalid request: {problems}")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 413: "payload_too_large"}.get(exc.status_code, "http_error")
        message = f"{request.method} {request.url.path}: {exc.detail}"
        if exc.status_code == 404:
            message += f" ({not_found_hint})"
        return respond(request, exc.status_code, code, message)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        return respond(request, 500, "internal_error", f"internal error: {exc!r}")


class AnthropicErrorShape:
    """Re-says an error in sandrl's shape, answered on an Anthropic route, in Anthropic's shape.

    Outermost on an app that serves those routes: the guards (the session key, loopback only, the body
    limit) refuse before the app runs, in sandrl's shape, and an Anthropic client (Claude Code) reads
    ``error.message``. Other routes, and answers that are not errors, pass untouched.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_anthropic(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        chunks: list[bytes] = []

        async def reshaped(message: Message) -> None:
            nonlocal start
            if start is None and message["type"] == "http.response.start" and message["status"] >= 400:
                start = message  # held until the body says whether it is sandrl's shape
                return
            if start is None or message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            body = _in_anthropic_shape(start["status"], b"".join(chunks))
            headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
            headers.append((b"content-length", str(len(body)).encode()))
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, reshaped)


def _in_anthropic_shape(status: int, body: bytes) -> bytes:
    try:
        data = json.loads(body)
    except ValueError:
        return body
    if not isinstance(data, dict) or data.get("type") == "error" or not isinstance(data.get("message"), str):
        return body
    error_code = data.get("error_code")
    return json.dumps(anthropic_error(status, str(error_code or "http_error"), data["message"])).encode()
