"""The server's side of the call channel: many calls in flight on one connection, answered as they finish.

Over HTTP/1.1 every call in flight needs a connection of its own, and each call costs both sides
an HTTP request and answer in Python plus a wake-up or two of each process: with hundreds of
clients that, not the sandboxes, was what the service spent its time on (``docs/service-throughput.md``).
On the channel (framed as :mod:`sandrl.sandbox.remote.frames` says) a call is one frame each way, and each side
writes what it has once per turn of its event loop, however many calls that holds.

The channel is a transport only: each call goes through the same ASGI app as the same request over
HTTP would (the e2b gateway, loopback and bearer checks, body limits, routes, error handlers,
metrics), with the headers that opened the channel (``Host``, ``Authorization``), so answers and
errors are those of HTTP by construction. Bounds: a call's body is at most ``max_body`` bytes
(larger ones are dropped as they arrive and answered 413, as HTTP answers them); at most
``max_in_flight`` calls run at once, and calls read beyond them wait, the connection unread, until
one ends. Routes that stream (``/exec/stream``, ``/files``, ``/tar``) are answered 400: they go over
plain HTTP.

Back-pressure: a client that does not read its answers stalls itself, not the server's memory.
While the connection's writes are paused (answers the client has not taken pass the transport's
high-water mark) no call starts, those already read wait, and the connection is not read; all
resumes when the client has drained its answers. Calls already in flight when writes paused still
answer, into the connection's buffer: past ``max_unread`` bytes of answers unread (the service's
``max_unread_bytes``) the channel is dropped (aborted: what it held is freed, its calls' answers
are lost as on a broken connection). What the server holds for a client that never reads is thus
one read's worth of calls, their answers up to ``max_unread`` (and the answers of one turn of the
event loop), and the calls in flight (at most ``max_in_flight``, as for a client that reads) while
they run.
"""

from __future__ import annotations

import asyncio
import logging
import re
import urllib.parse
from collections import deque
from collections.abc import Callable, Coroutine, MutableSet
from typing import Any, cast

import httptools
from starlette.requests import Request

from sandrl.sandbox.remote.frames import (
    CHANNEL_PATH,
    UPGRADE,
    ChannelProtocolError,
    Frame,
    FrameReader,
    TurnWriter,
    answer_frame,
    status_phrase,
)
from sandrl.sandbox.service.auth import error_response, too_large
from sandrl.sandbox.service.hot_routes import HotCalls, route
from sandrl.sandbox.service.routes import CHANNEL_EXTENSION
from sandrl.sandbox.service.state import ServiceConfig

log = logging.getLogger("sandrl.service")
MAX_IN_FLIGHT = 4096
_CALL_HEAD = re.compile(rb"^(\d{1,18}) ([A-Z]{1,16}) (/[\x21-\x7e]{0,4095})$")
_STREAMING = re.compile(r"/(exec/stream|files|tar)$")

Scope = dict[str, Any]
ASGIApp = Callable[..., Any]


class ChannelProtocol(asyncio.Protocol):
    """One upgraded connection; ``scope`` is the template each call's ASGI scope is made from."""

    def __init__(
        self,
        app: ASGIApp,
        scope: Scope,
        *,
        max_body: int,
        hot_calls: HotCalls,
        connections: MutableSet[Any],
        tasks: MutableSet[asyncio.Task[None]],
        max_in_flight: int = MAX_IN_FLIGHT,
        max_unread: int = ServiceConfig.max_unread_bytes,
    ) -> None:
        self.app = app
        self.scope = scope
        self.max_body = max_body
        self.hot_calls = hot_calls
        self.connections = connections
        self.tasks = tasks
        self.max_in_flight = max_in_flight
        self.max_unread = max_unread
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.reader = FrameReader(max_body)
        self.in_flight = 0
        self.closing = False
        self.lost: asyncio.Future[None] = self.loop.create_future()
        self.writer = TurnWriter(self.loop)
        self._write_paused = False
        self._read_paused = False
        self._backlog: deque[Frame] = deque()
        """Calls read but not started, while ``max_in_flight`` run or writes are paused (one read's worth at most)."""

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = self.writer.transport = cast(asyncio.Transport, transport)  # uvloop's do not subclass
        self.connections.add(self)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.reader.feed(data)
        except ChannelProtocolError as exc:
            log.warning("closing a call channel: %s", exc)
            self._close()
            return
        self._backlog.extend(frames)
        self._start_calls()

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.discard(self)
        if not self.lost.done():
            self.lost.set_result(None)

    def pause_writing(self) -> None:
        self._write_paused = True
        self._reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._start_calls()

    def shutdown(self) -> None:
        """uvicorn's graceful shutdown: calls in flight finish, new ones are refused, then the connection closes."""
        self.closing = True
        if not self.in_flight:
            self._close()

    # -- calls

    def _start(self, f: Frame) -> None:
        match = _CALL_HEAD.match(f.head)
        if match is None:
            log.warning("closing a call channel: a call's head is not '<id> <METHOD> <target>': %r", f.head[:200])
            self._close()
            return
        call_id = int(match[1])
        method, target = match[2].decode("ascii"), match[3].decode("ascii")
        raw_path, _, query = target.partition("?")
        path = urllib.parse.unquote(raw_path) if "%" in raw_path else raw_path
        if self.closing:
            self._error(call_id, 503, "service_draining", "the server is shutting down: retry on another server")
        elif f.body is None:
            self._error(call_id, 413, "payload_too_large", too_large(self.max_body))
        elif _STREAMING.search(path):
            self._error(
                call_id, 400, "invalid_request", f"{path} streams its body: send it over HTTP, not the call channel"
            )
        else:
            scope = {
                **self.scope,
                "method": method,
                "path": path,
                "raw_path": raw_path.encode("ascii"),
                "query_string": query.encode("ascii"),
                "headers": [*self.scope["headers"], *_body_headers(f.body)],
                "state": dict(self.scope["state"]),
            }
            # The hot routes skip the app's middleware: what it checks of a call is the channel's
            # own (host, origin and token, at the upgrade; the body's size, as it was read).
            found = route(method, path) if not query and not scope["root_path"] else None
            work = self._call(call_id, scope, f.body) if found is None else self._hot(call_id, found, scope, f.body)
            task = self.loop.create_task(work)
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
            self.in_flight += 1

    async def _call(self, call_id: int, scope: Scope, body: bytes) -> None:
        try:
            status, _, answer = await asgi_call(self.app, scope, body, self.lost)
        finally:
            self._ended()
        self._answer(call_id, status, answer)

    async def _hot(self, call_id: int, found: tuple[str, str], scope: Scope, body: bytes) -> None:
        try:
            response = await self.hot_calls.call(found, body, json_body=bool(body), request=lambda: Request(scope))
            if response is None:  # not one the hot path is sure of: the app answers it
                status, _, answer = await asgi_call(self.app, scope, body, self.lost)
            else:
                status, answer = response.status_code, bytes(response.body)
        except Exception as exc:
            log.exception("internal error on %s %s over the call channel", scope["method"], scope["path"])
            status, answer = await self._internal_error(scope, exc)
        finally:
            self._ended()
        self._answer(call_id, status, answer)

    async def _internal_error(self, scope: Scope, exc: Exception) -> tuple[int, bytes]:
        """The app's answer to an unexpected error (its handler counts it), or a plain 500 if that fails too."""
        try:
            response = await self.hot_calls.answer(Request(scope), exc, internal=True)
            return response.status_code, bytes(response.body)
        except Exception:
            return 500, error_response(500, "internal_error", "internal error: the server log has it")["body"]

    def _start_calls(self) -> None:
        while self._backlog and self.in_flight < self.max_in_flight and not self._write_paused:
            if self.transport is None or self.transport.is_closing():
                self._backlog.clear()
                return
            self._start(self._backlog.popleft())
        self._reading()

    def _ended(self) -> None:
        self.in_flight -= 1
        self._start_calls()
        if self.closing and not self.in_flight:
            self.loop.call_soon(self._close)  # after the answer this call is about to queue

    def _error(self, call_id: int, status: int, error_code: str, message: str) -> None:
        self._answer(call_id, status, error_response(status, error_code, message)["body"])

    def _answer(self, call_id: int, status: int, body: bytes) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            self.writer.write(answer_frame(call_id, status, body))
            if self._write_paused:
                self._check_unread(transport)

    def _check_unread(self, transport: asyncio.Transport) -> None:
        """Drop the channel once its client has left more than ``max_unread`` bytes of answers unread."""
        unread = transport.get_write_buffer_size() + self.writer.queued
        if unread > self.max_unread:
            log.warning(
                "dropping a call channel: its client left %d bytes of answers unread (the bound is %d) "
                "with %d calls still in flight",
                unread,
                self.max_unread,
                self.in_flight,
            )
            self._backlog.clear()
            transport.abort()  # not close(): that would hold every unread byte until the client took it

    def _reading(self) -> None:
        """Read while calls can start: the client reads its answers and fewer than ``max_in_flight`` run."""
        if self.transport is None or self.transport.is_closing():
            return
        pause = self._write_paused or bool(self._backlog) or self.in_flight >= self.max_in_flight
        if pause != self._read_paused:
            self._read_paused = pause
            if pause:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    def _close(self) -> None:
        self.writer.flush()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


def _body_headers(body: bytes) -> list[tuple[bytes, bytes]]:
    if not body:
        return [(b"content-length", b"0")]
    return [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode("ascii"))]


async def asgi_call(
    app: ASGIApp, scope: Scope, body: bytes, lost: asyncio.Future[None]
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """``app``'s whole answer (status, headers, body) to a request whose body is ``body``; its
    ``http.disconnect`` comes when ``lost`` is done."""
    status = 0
    headers: list[tuple[bytes, bytes]] = []
    chunks: list[bytes] = []
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await lost
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status, headers
        if message["type"] == "http.response.start":
            status, headers = int(message["status"]), list(message.get("headers", []))
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    try:
        await app(scope, receive, send)
    except Exception:
        if not status:  # the app's error middleware answers first when it can
            log.exception("internal error on %s %s over the call channel", scope["method"], scope["path"])
            answer = error_response(500, "internal_error", "internal error: the server log has it")
            return 500, answer["start"]["headers"], answer["body"]
    if not status:
        answer = error_response(500, "internal_error", "the app ended without an answer")
        return 500, answer["start"]["headers"], answer["body"]
    return status, headers, b"".join(chunks)


_KEPT = frozenset({b"host", b"authorization", b"x-api-key", b"user-agent"})
"""The upgrade's headers every call on the channel carries (never ``origin``, ``e2b-sandbox-id``...)."""
_SWITCHING = b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: " + UPGRADE + b"\r\n\r\n"


def start_channel(http: Any, rest: bytes) -> None:
    """Answer an upgrade to the call channel on ``http`` (the service's uvicorn protocol, its reading
    paused): the app decides as for any request to :data:`CHANNEL_PATH`, with the upgrade's headers
    (so the loopback and bearer checks hold), and on its consent the connection becomes a channel
    whose first bytes are ``rest``. Any other answer is sent as is and the connection closed."""
    task = http.loop.create_task(_closing_on_error(http.transport, _upgrade(http, rest)))
    http.tasks.add(task)
    task.add_done_callback(http.tasks.discard)


async def _closing_on_error(transport: asyncio.BaseTransport, work: Coroutine[Any, Any, None]) -> None:
    try:
        await work
    except BaseException:
        transport.close()
        raise


async def _upgrade(http: Any, rest: bytes) -> None:
    parsed = httptools.parse_url(http.url)
    raw_path: bytes = parsed.path
    path = raw_path.decode("ascii")
    scope = {
        **http.scope,
        "path": http.root_path + (urllib.parse.unquote(path) if "%" in path else path),
        "raw_path": http.root_path.encode("ascii") + raw_path,
        "query_string": parsed.query or b"",
        "extensions": {CHANNEL_EXTENSION: {}},
    }
    lost: asyncio.Future[None] = http.loop.create_future()
    status, headers, body = await asgi_call(http.app, scope, b"", lost)
    transport: asyncio.Transport = http.transport
    if transport.is_closing():
        return
    consent = scope["extensions"][CHANNEL_EXTENSION]
    if status != 200 or scope["path"] != CHANNEL_PATH or "hot_calls" not in consent:
        reason = status_phrase(status)
        kept = b"".join(n + b": " + v + b"\r\n" for n, v in headers if n not in (b"content-length", b"connection"))
        head = b"HTTP/1.1 %d %s\r\n%scontent-length: %d\r\nconnection: close\r\n\r\n" % (
            status,
            reason.encode(),
            kept,
            len(body),
        )
        transport.write(head + body)
        transport.close()
        return
    transport.write(_SWITCHING)
    http.connections.discard(http)
    template = {
        "type": "http",
        "asgi": http.scope["asgi"],
        "http_version": "1.1",
        "server": http.server,
        "client": http.client,
        "scheme": http.scheme,
        "root_path": http.root_path,
        "headers": [(n, v) for n, v in http.headers if n in _KEPT],
        "state": http.app_state,
    }
    channel = ChannelProtocol(
        http.app,
        template,
        max_body=consent["max_call_bytes"],
        max_unread=consent["max_unread"],
        hot_calls=consent["hot_calls"],
        connections=http.connections,
        tasks=http.tasks,
    )
    transport.set_protocol(channel)
    channel.connection_made(transport)
    gauge = consent["open"]
    gauge.inc()
    channel.lost.add_done_callback(lambda _: gauge.dec())
    transport.resume_reading()
    if rest:
        channel.data_received(rest)
