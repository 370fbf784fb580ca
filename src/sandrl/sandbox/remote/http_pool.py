"""An HTTP/1.1 connection pool whose cost per request does not grow with the pool, nor with httpx's machinery.

httpcore's pool (httpx's default transport) walks every connection, and every queued request,
each time a request starts or a response closes, and asks each idle connection's socket whether
it is readable (``getpeername``, ``poll``...): with hundreds of clients on one event loop the
client spends its time there, not on the requests (profiled in ``docs/service-throughput.md``).
This pool keeps idle connections per origin in a stack (the most recently used first: its
socket is warm and least likely closed by the server), takes one in O(1), and learns that the
server closed a connection from the event loop (the stream's EOF) instead of asking the socket.

Two ways in, one pool and one framing:

- :meth:`PooledTransport.fetch`: a request whose body is in memory and whose answer is read
  whole (the sandbox client's create, exec, close...). Its head is written as given and the
  answer parsed by httptools (llhttp, the parser uvicorn serves with); no ``httpx.Request`` or
  ``httpx.Response`` is built. Per ``exec true`` this costs the client about a fifth of the CPU
  the httpx path did.
- :meth:`PooledTransport.handle_async_request`: any ``httpx.Request`` (streamed bodies, streamed
  answers), as an ``httpx.AsyncBaseTransport``.

A request that finds a reused connection closed before any byte of the answer came (the server's
keep-alive timer won the race) is sent again on a new connection once, when it cannot have run
twice: it never reached the server, or it is idempotent. Idle connections are dropped before
the server's usual keep-alive timeout (5 s) would close them. Plain ``http://`` only: anything
else goes to httpx's own transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import httptools
import httpx

__all__ = ["Answer", "PooledTransport"]

_READ = 1 << 16
_IDEMPOTENT = {"GET", "HEAD", "PUT", "DELETE", "OPTIONS"}
IDLE_EXPIRY_S = 4.0
"""Idle connections older than this are closed rather than reused (uvicorn closes them at 5 s)."""
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Answer:
    """A whole answer to :meth:`PooledTransport.fetch` (the part of ``httpx.Response`` callers use)."""

    status_code: int
    reason_phrase: str
    headers: list[tuple[bytes, bytes]]
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.content)

    async def aread(self) -> bytes:
        return self.content

    async def aclose(self) -> None:
        return None


class _Reply:
    """One answer on a connection, parsed by httptools (these are its callbacks): head, body parts not yet taken."""

    __slots__ = (
        "chunks",
        "complete",
        "extra",
        "head_done",
        "headers",
        "keep_alive",
        "parser",
        "reason",
        "status",
        "until_close",
    )

    def __init__(self) -> None:
        self.headers: list[tuple[bytes, bytes]] = []
        self.reason = b""
        self.status = 0
        self.head_done = False
        self.complete = False
        self.extra = False
        """More came after this answer: the connection is out of step and is not reused."""
        self.until_close = False
        """The answer has no length: its body ends when the server closes the connection."""
        self.chunks: list[bytes] = []
        self.keep_alive = False
        """Both sides keep the connection open after this answer (read as it completes: llhttp forgets)."""
        self.parser = httptools.HttpResponseParser(self)

    def on_message_begin(self) -> None:
        if self.complete:
            self.extra = True

    def on_status(self, reason: bytes) -> None:
        self.reason = reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # informational: the answer follows on the same connection
            self.headers = []
            return
        self.status, self.head_done = status, True
        names = {name.lower() for name, _ in self.headers}
        self.until_close = (
            b"content-length" not in names and b"transfer-encoding" not in names and status not in (204, 304)
        )

    def on_body(self, data: bytes) -> None:
        if not self.complete:
            self.chunks.append(data)

    def on_message_complete(self) -> None:
        if self.head_done:
            self.complete = True
            self.keep_alive = self.parser.should_keep_alive()


@dataclass
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    loop: asyncio.AbstractEventLoop
    idle_since: float = 0.0
    reused: bool = False
    reply: _Reply | None = None
    reusable: bool = False

    def usable(self, now: float) -> bool:
        return (
            not self.reader.at_eof()
            and not self.writer.is_closing()
            and now - self.idle_since < IDLE_EXPIRY_S
            and self.loop is asyncio.get_running_loop()  # not one of an earlier asyncio.run
        )

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()

    def start_reply(self) -> _Reply:
        self.reply = reply = _Reply()
        self.reusable = False
        return reply

    async def read_more(self, reply: _Reply) -> bool:
        """Read what the server sent and parse it; False when the server closed the connection."""
        try:
            data = await self.reader.read(_READ)
        except ConnectionError as exc:
            raise httpx.ReadError(str(exc)) from exc
        if not data:
            return False
        try:
            reply.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            raise httpx.RemoteProtocolError(f"the server's answer is not HTTP/1.1: {exc}") from exc
        return True

    def finish(self, reply: _Reply) -> None:
        """The answer is complete: the connection may carry the next request if both sides keep it."""
        self.reusable = not reply.extra and not reply.until_close and reply.keep_alive


class _Stale(Exception):
    """A reused connection was closed under the request before any answer came."""

    def __init__(self, *, unsent: bool = False) -> None:
        super().__init__()
        self.unsent = unsent
        """The request did not reach the server (writing it failed), so it did not run."""


class PooledTransport(httpx.AsyncBaseTransport):
    """At most ``max_connections`` connections at once, to any number of origins."""

    def __init__(self, *, max_connections: int = 100, connect_timeout_s: float = 10.0) -> None:
        self.max_connections = max_connections
        self.connect_timeout_s = connect_timeout_s
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._open = 0
        self._waiters: list[asyncio.Future[None]] = []
        self._fallback: httpx.AsyncHTTPTransport | None = None

    # -- connections

    async def _acquire(self, origin: tuple[str, int], timeout: float | None) -> _Connection:
        now = time.monotonic()
        idle = self._idle.get(origin)
        while idle:
            conn = idle.pop()
            if conn.usable(now):
                conn.reused = True
                return conn
            self._discard(conn)
        while self._open >= self.max_connections:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                async with asyncio.timeout(timeout):
                    await waiter
            except TimeoutError:
                raise httpx.PoolTimeout(f"no free connection among {self.max_connections} within {timeout} s") from None
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
            idle = self._idle.get(origin)
            if idle:
                conn = idle.pop()
                if conn.usable(time.monotonic()):
                    conn.reused = True
                    return conn
                self._discard(conn)
        self._open += 1
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                reader, writer = await asyncio.open_connection(origin[0], origin[1], limit=_READ)
        except (OSError, TimeoutError) as exc:
            self._open -= 1
            self._wake()
            kind = httpx.ConnectTimeout if isinstance(exc, TimeoutError) else httpx.ConnectError
            raise kind(f"cannot connect to {origin[0]}:{origin[1]}: {exc or 'timed out'}") from exc
        return _Connection(reader, writer, asyncio.get_running_loop())

    def _release(self, conn: _Connection, origin: tuple[str, int]) -> None:
        """Back to the pool when both sides finished the exchange cleanly; closed otherwise."""
        if conn.reusable and not conn.writer.is_closing():
            conn.idle_since = time.monotonic()
            self._idle.setdefault(origin, []).append(conn)
            self._wake()
        else:
            self._discard(conn)

    def _discard(self, conn: _Connection) -> None:
        conn.close()
        self._open -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.pop(0)
            if not waiter.done():
                waiter.set_result(None)
                return

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
        if self._fallback is not None:
            await self._fallback.aclose()

    async def _on_a_connection(
        self,
        origin: tuple[str, int],
        pool_timeout: float | None,
        replayable: bool,
        exchange: Callable[[_Connection], Awaitable[_T]],
    ) -> _T:
        """``exchange`` on a pooled connection; again on a new one when a reused one was stale and that is safe.
        ``exchange`` hands the connection back (or keeps it for a streamed body) when it returns."""
        for attempt in (0, 1):
            conn = await self._acquire(origin, pool_timeout)
            try:
                return await exchange(conn)
            except _Stale as stale:
                self._discard(conn)
                if attempt or not (replayable or stale.unsent):
                    raise httpx.RemoteProtocolError("the server closed the connection before answering") from None
            except BaseException:
                self._discard(conn)
                raise
        raise AssertionError("unreachable")

    # -- requests whose body is in memory, answers read whole

    async def fetch(
        self,
        origin: tuple[str, int],
        method: str,
        head: bytes,
        body: bytes = b"",
        *,
        timeout: float | None,
        pool_timeout: float | None = None,
    ) -> Answer:
        """Send ``head`` (request line and headers, ``Content-Length`` included, ending in a blank
        line) and ``body`` in one write; the whole answer within ``timeout`` seconds."""
        if method == "HEAD":
            raise ValueError("fetch reads a body; send HEAD requests through handle_async_request")

        async def exchange(conn: _Connection) -> Answer:
            try:
                async with asyncio.timeout(timeout):
                    reply = await _send_and_read_head(conn, head + body if body else head)
                    while not reply.complete:
                        if not await conn.read_more(reply):
                            if not reply.until_close:
                                raise httpx.RemoteProtocolError("the server closed the connection within an answer")
                            break
            except TimeoutError:
                raise httpx.ReadTimeout(f"no whole answer within {timeout} s") from None
            conn.finish(reply)
            content = b"".join(reply.chunks)
            self._release(conn, origin)
            return Answer(reply.status, reply.reason.decode("latin-1"), reply.headers, content)

        return await self._on_a_connection(origin, pool_timeout, method in _IDEMPOTENT, exchange)

    # -- any httpx.Request

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.scheme != "http" or request.method == "HEAD":
            if self._fallback is None:
                self._fallback = httpx.AsyncHTTPTransport()
            return await self._fallback.handle_async_request(request)
        timeouts = request.extensions.get("timeout", {})
        origin = (request.url.host, request.url.port or 80)
        in_memory = isinstance(request.stream, httpx.ByteStream)
        lines = [f"{request.method} {request.url.raw_path.decode('ascii')} HTTP/1.1\r\n".encode()]
        lines += [name + b": " + value + b"\r\n" for name, value in request.headers.raw]
        names = {name.lower() for name, _ in request.headers.raw}
        chunked = not in_memory and b"content-length" not in names
        if chunked and b"transfer-encoding" not in names:
            lines.append(b"transfer-encoding: chunked\r\n")
        lines.append(b"\r\n")
        head = b"".join(lines)
        read_timeout = timeouts.get("read")

        async def exchange(conn: _Connection) -> httpx.Response:
            if in_memory:
                # A body already in memory goes out with the head in one write: one segment, so
                # the server wakes once per request, not once for the head and again for the body.
                message = head + b"".join(request.stream)  # type: ignore[arg-type]
                reply = await _timed(_send_and_read_head(conn, message), read_timeout, httpx.ReadTimeout)
            else:
                await _write_streamed(conn, head, request.stream, chunked, timeouts.get("write"))  # type: ignore[arg-type]
                reply = await _timed(_read_head(conn), read_timeout, httpx.ReadTimeout)
            return httpx.Response(
                status_code=reply.status,
                headers=reply.headers,
                stream=_Body(self, conn, origin, read_timeout),
                extensions={"http_version": b"HTTP/1.1", "reason_phrase": reply.reason},
            )

        replayable = in_memory and request.method in _IDEMPOTENT
        return await self._on_a_connection(origin, timeouts.get("pool"), replayable, exchange)


async def _send_and_read_head(conn: _Connection, message: bytes) -> _Reply:
    try:
        conn.writer.write(message)
        await conn.writer.drain()
    except ConnectionError as exc:
        if conn.reused:
            raise _Stale(unsent=True) from exc
        raise httpx.WriteError(str(exc)) from exc
    return await _read_head(conn)


async def _write_streamed(
    conn: _Connection, head: bytes, stream: AsyncIterator[bytes], chunked: bool, timeout: float | None
) -> None:
    try:
        conn.writer.write(head)
        async for chunk in stream:
            if chunk:
                conn.writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
                await _timed(conn.writer.drain(), timeout, httpx.WriteTimeout)
        if chunked:
            conn.writer.write(b"0\r\n\r\n")
        await _timed(conn.writer.drain(), timeout, httpx.WriteTimeout)
    except ConnectionError as exc:
        # Never "unsent" (sent again): the stream is partly read and cannot be sent again (httpx's
        # wrapper raises StreamConsumed, an error no caller types); a write error is typed as a lost connection.
        raise httpx.WriteError(str(exc)) from exc


async def _read_head(conn: _Connection) -> _Reply:
    """Read until the answer's head is parsed (its first body bytes may be in ``chunks`` already)."""
    reply = conn.start_reply()
    first = True
    while not reply.head_done:
        try:
            more = await conn.read_more(reply)
        except httpx.ReadError:
            if first and conn.reused:
                raise _Stale from None
            raise
        if not more:
            if first and conn.reused:
                raise _Stale
            raise httpx.RemoteProtocolError("the server closed the connection before answering")
        first = False
    return reply


async def _timed(awaitable: Awaitable[_T], timeout: float | None, kind: type[httpx.TimeoutException]) -> _T:
    try:
        async with asyncio.timeout(timeout):
            return await awaitable
    except TimeoutError:
        raise kind(f"no progress within {timeout} s") from None


class _Body(httpx.AsyncByteStream):
    """A streamed answer's body; the connection goes back to the pool when it is read to the end and closed."""

    def __init__(
        self, pool: PooledTransport, conn: _Connection, origin: tuple[str, int], timeout: float | None
    ) -> None:
        self._pool, self._origin, self._timeout = pool, origin, timeout
        self._conn: _Connection | None = conn
        self._done = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn = self._conn
        if conn is None:
            raise httpx.StreamClosed()
        reply = conn.reply
        assert reply is not None
        while True:
            if reply.chunks:
                chunks, reply.chunks = reply.chunks, []
                for chunk in chunks:
                    yield chunk
            if reply.complete:
                break
            if not await _timed(conn.read_more(reply), self._timeout, httpx.ReadTimeout):
                if reply.until_close:
                    break
                raise httpx.RemoteProtocolError("the server closed the connection in the middle of a response")
        conn.finish(reply)
        self._done = True

    async def aclose(self) -> None:
        if self._conn is None:
            return
        conn, self._conn = self._conn, None
        if self._done:
            self._pool._release(conn, self._origin)
        else:
            self._pool._discard(conn)
