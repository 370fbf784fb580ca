"""The error bodies of sandrl's inference HTTP apps (the server and the session gateway).

Everywhere ``{code, error_code, message}``; on OpenAI routes (``/v1/...``) also OpenAI's ``error``
object, which the official ``openai`` package reads its message from.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from sandrl.errors import SandrlError


def error_body(status: int, error_code: str, message: str, *, openai: bool) -> JSONResponse:
    """sandrl's error body ``{code, error_code, message}``; on OpenAI routes also the ``error`` object
    the official ``openai`` package reads its message from."""
    body: dict[str, Any] = {"code": status, "error_code": error_code, "message": message}
    if openai:
        body["error"] = {"message": message, "type": error_code, "param": None, "code": error_code}
    return JSONResponse(body, status_code=status)


def install_error_handlers(app: FastAPI, *, not_found_hint: str) -> None:
    """sandrl's error bodies on ``app``: typed errors with their status, bad requests as 400, the rest as 500."""

    def is_openai(request: Request) -> bool:
        return request.url.path.startswith("/v1/")

    @app.exception_handler(SandrlError)
    async def sandrl_error(request: Request, exc: SandrlError) -> JSONResponse:
        return error_body(exc.http_status, exc.error_code, exc.message, openai=is_openai(request))

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err.get('loc', ()) if p != 'body') or 'body'}: {err.get('msg')}"
            for err in exc.errors()
        )
        return error_body(400, "invalid_request", f"invalid request: {problems}", openai=is_openai(request))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 413: "payload_too_large"}.get(exc.status_code, "http_error")
        message = f"{request.method} {request.url.path}: {exc.detail}"
        if exc.status_code == 404:
            message += f" ({not_found_hint})"
        return error_body(exc.status_code, code, message, openai=is_openai(request))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        return error_body(500, "internal_error", f"internal error: {exc!r}", openai=is_openai(request))
