"""An HTTP/1.1 connection pool for httpx whose cost per request does not grow with the pool.

httpcore's pool (httpx's default transport) walks every connection, and every queued request,
each time a request starts or a response closes, and asks each idle connection's socket whether
it is readable (``getpeername``, ``poll``...): with hundreds of clients on one event loop the
client spends its time there, not on the requests (profiled in ``docs/service-throughput.md``).
This pool keeps idle connections per origin in a stack (the most recently used first: its
socket is warm and least likely closed by the server), takes one in O(1), and learns that the
server closed a connection from the event loop (the stream's EOF) instead of asking the socket.

Framing is h11's (the parser uvicorn and httpcore use). A request that finds a reused connection
closed before any byte of the answer came (the server's keep-alive timer won the race) is sent
again on a new connection once, when its body can be sent again; idle connections are dropped
before the server's usual keep-alive timeout (5 s) would close them. Plain ``http://`` only:
anything else goes to httpx's own transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import h11
import httpx

__all__ = ["PooledTransport"]

_READ = 1 << 16
_IDEMPOTENT = {"GET", "HEAD", "PUT", "DELETE", "OPTIONS"}
IDLE_EXPIRY_S = 4.0
"""Idle connections older than this are closed rather than reused (uvicorn closes them at 5 s)."""


@dataclass
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    h11: h11.Connection = field(default_factory=lambda: h11.Connection(h11.CLIENT))
    idle_since: float = 0.0
    reused: bool = False

    def usable(self, now: float) -> bool:
        return not self.reader.at_eof() and not self.writer.is_closing() and now - self.idle_since < IDLE_EXPIRY_S

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


class _Stale(Exception):
    """A reused connection was closed under the request before any answer came."""

    def __init__(self, *, unsent: bool = False) -> None:
        super().__init__()
        self.unsent = unsent
        """The request did not reach the server (writing it failed), so it did not run."""


class PooledTransport(httpx.AsyncBaseTransport):
    """``httpx.AsyncClient(transport=PooledTransport(...))``: at most ``max_connections`` at once."""

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
        return _Connection(reader, writer)

    def _release(self, conn: _Connection, origin: tuple[str, int]) -> None:
        """Back to the pool when both sides finished the exchange cleanly; closed otherwise."""
        if conn.h11.our_state is h11.DONE and conn.h11.their_state is h11.DONE and not conn.writer.is_closing():
            conn.h11.start_next_cycle()
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

    # -- requests

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.scheme != "http":
            if self._fallback is None:
                self._fallback = httpx.AsyncHTTPTransport()
            return await self._fallback.handle_async_request(request)
        timeouts = request.extensions.get("timeout", {})
        origin = (request.url.host, request.url.port or 80)
        # Sent again only when it cannot have run twice: the server never saw it, or it is idempotent
        # (a POST whose connection closes unanswered may be running: that is the caller's to judge).
        replayable = isinstance(request.stream, httpx.ByteStream) and request.method in _IDEMPOTENT
        for attempt in (0, 1):
            conn = await self._acquire(origin, timeouts.get("pool"))
            try:
                return await self._exchange(conn, origin, request, timeouts)
            except _Stale as stale:
                self._discard(conn)
                if attempt or not (replayable or stale.unsent):
                    raise httpx.RemoteProtocolError("the server closed the connection before answering") from None
            except BaseException:
                self._discard(conn)
                raise
        raise AssertionError("unreachable")

    async def _exchange(
        self, conn: _Connection, origin: tuple[str, int], request: httpx.Request, timeouts: dict[str, float | None]
    ) -> httpx.Response:
        headers = [(k, v) for k, v in request.headers.raw if k.lower() != b"host"]
        host = request.url.netloc
        event = h11.Request(method=request.method, target=request.url.raw_path, headers=[(b"host", host), *headers])
        try:
            head = conn.h11.send(event) or b""
            if isinstance(request.stream, httpx.ByteStream):
                # A body already in memory (JSON, bytes) goes out with the head in one write: one
                # segment, so the server wakes once per request, not once for the head and again for the body.
                parts = [head]
                parts += (conn.h11.send(h11.Data(data=chunk)) or b"" for chunk in request.stream if chunk)
                parts.append(conn.h11.send(h11.EndOfMessage()) or b"")
                conn.writer.write(b"".join(parts))
            else:
                conn.writer.write(head)
                async for chunk in request.stream:  # type: ignore[union-attr]
                    conn.writer.write(conn.h11.send(h11.Data(data=chunk)) or b"")
                    await _timed(conn.writer.drain(), timeouts.get("write"), httpx.WriteTimeout)
                conn.writer.write(conn.h11.send(h11.EndOfMessage()) or b"")
            await _timed(conn.writer.drain(), timeouts.get("write"), httpx.WriteTimeout)
        except (ConnectionError, h11.LocalProtocolError) as exc:
            if conn.reused:
                raise _Stale(unsent=True) from exc
            raise httpx.WriteError(str(exc)) from exc
        read_timeout = timeouts.get("read")
        first = True
        while True:
            got = conn.h11.next_event()
            if got is h11.NEED_DATA:
                try:
                    data = await _timed(conn.reader.read(_READ), read_timeout, httpx.ReadTimeout)
                except ConnectionError as exc:
                    if first and conn.reused:
                        raise _Stale from exc
                    raise httpx.ReadError(str(exc)) from exc
                if not data and first and conn.reused:
                    raise _Stale
                first = False
                conn.h11.receive_data(data)
                continue
            if isinstance(got, h11.InformationalResponse):
                continue
            if isinstance(got, h11.Response):
                break
            raise httpx.RemoteProtocolError(f"unexpected {type(got).__name__} before the response")
        return httpx.Response(
            status_code=got.status_code,
            headers=list(got.headers),
            stream=_Body(self, conn, origin, read_timeout),
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": got.reason},
        )


async def _timed(awaitable: object, timeout: float | None, kind: type[httpx.TimeoutException]) -> bytes:
    try:
        async with asyncio.timeout(timeout):
            return await awaitable  # type: ignore[misc, no-any-return]
    except TimeoutError:
        raise kind(f"no progress within {timeout} s") from None


class _Body(httpx.AsyncByteStream):
    """The response body; the connection goes back to the pool when it is read to the end and closed."""

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
        while True:
            try:
                got = conn.h11.next_event()
            except h11.RemoteProtocolError as exc:
                raise httpx.RemoteProtocolError(str(exc)) from exc
            if got is h11.NEED_DATA:
                try:
                    data = await _timed(conn.reader.read(_READ), self._timeout, httpx.ReadTimeout)
                except ConnectionError as exc:
                    raise httpx.ReadError(str(exc)) from exc
                try:
                    conn.h11.receive_data(data)
                except h11.RemoteProtocolError as exc:
                    raise httpx.RemoteProtocolError(str(exc)) from exc
                continue
            if isinstance(got, h11.Data):
                yield bytes(got.data)
            elif isinstance(got, h11.EndOfMessage):
                self._done = True
                return
            elif isinstance(got, h11.ConnectionClosed):
                raise httpx.RemoteProtocolError("the server closed the connection in the middle of a response")

    async def aclose(self) -> None:
        if self._conn is None:
            return
        conn, self._conn = self._conn, None
        if self._done:
            self._pool._release(conn, self._origin)
        else:
            self._pool._discard(conn)
