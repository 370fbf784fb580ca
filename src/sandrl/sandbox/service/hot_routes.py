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
exception handlers: the wire is the same either way. The handling itself is :class:`HotCalls`,
which the call channel (:mod:`.channel`) uses too.
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
from sandrl.sandbox.remote.wire import API_PREFIX, CreateRequest, ExecRequest
from sandrl.sandbox.service.routes import SANDBOX_ID_PATTERN, create, delete, exec_in
from sandrl.sandbox.service.state import SandboxService

_SANDBOXES = API_PREFIX + "/sandboxes"
_ID = re.compile(SANDBOX_ID_PATTERN)
Handler = Callable[[Request, Exception], Response | Awaitable[Response]]


class HotCalls:
    """The three hot routes' handling, shared by :class:`HotRoutes` (HTTP) and the call channel
    (:mod:`.channel`); ``handlers`` are the app's exception handlers (``app.exception_handlers``)."""

    def __init__(self, service: SandboxService, handlers: Mapping[Any, Handler]) -> None:
        self.service = service
        self.handlers = handlers

    async def call(
        self, route: tuple[str, str], body: bytes, *, json_body: bool, request: Callable[[], Request]
    ) -> Response | None:
        """The answer to ``route`` (as :func:`route` gives it) with ``body``; None when the body is not
        JSON (``json_body``) that validates, to leave the request to the app. ``request`` makes the
        request the app's exception handlers are given, when one is needed."""
        kind, sandbox_id = route
        try:
            if kind == "delete":
                return await delete(self.service, sandbox_id)
            model: type[BaseModel] = CreateRequest if kind == "create" else ExecRequest
            parsed = _parse(body, model) if json_body else None
            if parsed is None:
                return None
            if isinstance(parsed, CreateRequest):
                return await create(self.service, parsed)
            assert isinstance(parsed, ExecRequest)
            return await exec_in(self.service, sandbox_id, parsed)
        except (SandrlError, HTTPException) as exc:
            return await self.answer(request(), exc)

    async def answer(self, request: Request, exc: Exception, *, internal: bool = False) -> Response:
        """The app's answer to ``exc``: its handler for the nearest class, as Starlette looks it up;
        the handler of ``Exception`` itself only when ``internal`` (over HTTP, Starlette's error
        middleware calls that one)."""
        for cls in type(exc).__mro__:
            handler = self.handlers.get(cls)
            if handler is not None and (internal or cls is not Exception):
                answer = handler(request, exc)
                return await answer if inspect.isawaitable(answer) else answer
        raise exc


class HotRoutes:
    """Serves ``POST /v1/sandboxes``, ``POST /v1/sandboxes/{id}/exec`` and ``DELETE /v1/sandboxes/{id}``
    without FastAPI's routing, with :class:`HotCalls`."""

    def __init__(self, app: ASGIApp, *, calls: HotCalls) -> None:
        self.app = app
        self.calls = calls

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = (
            route(scope["method"], scope["path"]) if scope["type"] == "http" and not scope.get("root_path") else None
        )
        if found is None:
            await self.app(scope, receive, send)
            return
        try:
            body = b"" if found[0] == "delete" else await _body(receive)
        except HTTPException as exc:  # the body limit's, raised from receive()
            await (await self.calls.answer(Request(scope, receive), exc))(scope, receive, send)
            return
        if body is None:
            return  # the client went away before it sent its request
        json_body = _json_type(scope)
        response = await self.calls.call(found, body, json_body=json_body, request=lambda: Request(scope, receive))
        if response is None:
            await self.app(scope, _replay(body, receive), send)
            return
        await response(scope, receive, send)


def route(method: str, path: str) -> tuple[str, str] | None:
    """Which hot route (``create``, ``exec``, ``delete``) and sandbox id a request is for, if any."""
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


def _json_type(scope: Scope) -> bool:
    """Whether the request's (first) ``Content-Type`` is exactly ``application/json``."""
    for name, value in scope["headers"]:
        if name == b"content-type":
            return bool(value == b"application/json")
    return False


def _parse(body: bytes, model: type[BaseModel]) -> BaseModel | None:
    """``body`` as ``model`` when it validates; None to leave it to FastAPI."""
    try:
        return model.model_validate_json(body)
    except ValidationError:
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
