"""A lean dispatch of the native API's hot routes: create, exec and delete.

Every cycle of a client (create, execs, delete) goes through these three. Through FastAPI each
request also paid for Starlette's routing across every native and E2B route, a ``Request``, the
dependency solver, a JSON parse and a validation of the parsed dict, and two more middleware
layers: under 64 clients that was about as much of the server's CPU as the endpoints' own work.

:class:`HotRoutes` sits inside the auth and body-limit middleware (so those hold as for any
route) and serves the three itself: it matches the method and path, reads the body, validates it
with the route's own model straight from the JSON bytes, and calls the same handler the FastAPI
route calls (:func:`~sandrl.sandbox.service.routes.create`, ``exec_in``, ``delete``). Whatever it is
not sure of goes to the app unchanged, with the body it read: another route or method, a body that
is not ``application/json``, one that does not validate, an id the route's pattern refuses. So a
refused request gets FastAPI's own answer, and an error of the handler is answered by the app's own
exception handlers: the wire is the same either way.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandrl.errors import SandrlError
from sandrl.sandbox.service.api import API_PREFIX, CreateRequest, ExecRequest
from sandrl.sandbox.service.routes import SANDBOX_ID_PATTERN, create, delete, exec_in
from sandrl.sandbox.service.state import SandboxService

_SANDBOXES = API_PREFIX + "/sandboxes"
_ID = re.compile(SANDBOX_ID_PATTERN)
Handler = Callable[[Request, Exception], Response | Awaitable[Response]]


class HotRoutes:
    """Serves ``POST /v1/sandboxes``, ``POST /v1/sandboxes/{id}/exec`` and ``DELETE /v1/sandboxes/{id}``
    without FastAPI's routing; ``handlers`` are the app's exception handlers (``app.exception_handlers``)."""

    def __init__(self, app: ASGIApp, *, service: SandboxService, handlers: Mapping[Any, Handler]) -> None:
        self.app = app
        self.service = service
        self.handlers = handlers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = _route(scope) if scope["type"] == "http" and not scope.get("root_path") else None
        if route is None:
            await self.app(scope, receive, send)
            return
        method, sandbox_id = route
        try:
            if method == "delete":
                response = await delete(self.service, sandbox_id)
            else:
                body = await _body(receive)
                if body is None:
                    return  # the client went away before it sent its request
                model: type[BaseModel] = CreateRequest if method == "create" else ExecRequest
                parsed = _parse(scope, body, model)
                if parsed is None:
                    await self.app(scope, _replay(body, receive), send)
                    return
                if isinstance(parsed, CreateRequest):
                    response = await create(self.service, parsed)
                else:
                    assert isinstance(parsed, ExecRequest)
                    response = await exec_in(self.service, sandbox_id, parsed)
        except (SandrlError, HTTPException) as exc:
            response = await self._answer(scope, receive, exc)
        await response(scope, receive, send)

    async def _answer(self, scope: Scope, receive: Receive, exc: Exception) -> Response:
        """The app's answer to ``exc``: its handler for the nearest class, as Starlette looks it up."""
        for cls in type(exc).__mro__:
            handler = self.handlers.get(cls)
            if handler is not None and cls is not Exception:
                answer = handler(Request(scope, receive), exc)
                return await answer if inspect.isawaitable(answer) else answer
        raise exc


def _route(scope: Scope) -> tuple[str, str] | None:
    """Which hot route (``create``, ``exec``, ``delete``) and sandbox id the request is for, if any."""
    path: str = scope["path"]
    method: str = scope["method"]
    if path == _SANDBOXES:
        return ("create", "") if method == "POST" else None
    if not path.startswith(_SANDBOXES + "/"):
        return None
    parts = path[len(_SANDBOXES) + 1 :].split("/")
    if not _ID.match(parts[0]):
        return None
    if len(parts) == 1 and method == "DELETE":
        return "delete", parts[0]
    if len(parts) == 2 and parts[1] == "exec" and method == "POST":
        return "exec", parts[0]
    return None


def _parse(scope: Scope, body: bytes, model: type[BaseModel]) -> BaseModel | None:
    """``body`` as ``model`` when it is a JSON body that validates; None to leave it to FastAPI."""
    for name, value in scope["headers"]:
        if name == b"content-type":
            if value != b"application/json":
                return None
            try:
                return model.model_validate_json(body)
            except ValidationError:
                return None
    return None


async def _body(receive: Receive) -> bytes | None:
    """The whole request body; None if the client disconnected first."""
    chunks = []
    while True:
        message: Message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` with ``body`` (already read) given back first."""
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> Message:
        if pending:
            return pending.pop()
        message: Message = await receive()
        return message

    return replayed
