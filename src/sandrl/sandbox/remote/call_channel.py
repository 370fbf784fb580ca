"""The client's side of the call channel (:mod:`sandrl.sandbox.remote.frames` has the wire).

:class:`CallChannel` carries a :class:`~sandrl.sandbox.remote.provider.RemoteProvider`'s in-memory calls
(create, exec, close, get, timeout) over one upgraded connection: every call in flight shares it,
answers come back as calls finish, and everything a turn of the event loop sends goes out in one
write. It opens the connection at the first call, and again after the server closed it.

Failures are the HTTP pool's (:mod:`sandrl.sandbox.remote.http_pool`), so the provider's retry and error
policy is the same on both: the connection or its upgrade could not be made within the connect
timeout -> ``httpx.ConnectError`` / ``ConnectTimeout``; the connection broke with the call in flight
-> ``httpx.ReadError``; no answer within the call's timeout -> ``httpx.ReadTimeout`` (the call's
answer is then dropped whenever it comes). A server without the channel (an older sandrl, a
proxy that does not pass upgrades) answers the upgrade with an error status: then
:meth:`CallChannel.fetch` returns None and the provider sends its calls over HTTP from then on.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import cast

import httpx

from sandrl.sandbox.remote import frames
from sandrl.sandbox.remote.http_pool import Answer

log = logging.getLogger("sandrl.client")
MAX_ANSWER = 1 << 30
"""Longest answer body a client takes (an exec's output is capped far below this by the server)."""
_MAX_HANDSHAKE = 64 << 10


class _Connection(asyncio.Protocol):
    """One upgraded connection: the upgrade's answer first, then answer frames."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.upgraded: asyncio.Future[int] = self.loop.create_future()
        """The status of the upgrade's answer (101 when the channel is open)."""
        self.waiters: dict[int, asyncio.Future[Answer]] = {}
        self.open = True
        self._head = bytearray()
        self._reader = frames.FrameReader(MAX_ANSWER)
        self._writer = frames.TurnWriter(self.loop)
        self._writable = asyncio.Event()
        self._writable.set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = self._writer.transport = cast(asyncio.Transport, transport)  # uvloop's do not subclass

    def data_received(self, data: bytes) -> None:
        try:
            if not self.upgraded.done():
                data = self._handshake(data)
            for f in self._reader.feed(data) if data else ():
                self._answered(f)
        except frames.ChannelProtocolError as exc:
            self.close(httpx.RemoteProtocolError(f"the server broke the call channel's framing: {exc}"))

    def _handshake(self, data: bytes) -> bytes:
        """Take the upgrade's answer from ``data``; what follows it is the channel's."""
        self._head += data
        end = self._head.find(b"\r\n\r\n")
        if end < 0:
            if len(self._head) > _MAX_HANDSHAKE:
                raise frames.ChannelProtocolError("the answer to the upgrade has no end of head")
            return b""
        line = bytes(self._head[: self._head.find(b"\r\n")]).split(b" ", 2)
        if len(line) < 2 or not line[0].startswith(b"HTTP/") or not line[1].isdigit():
            raise frames.ChannelProtocolError(f"the answer to the upgrade is not HTTP: {bytes(self._head[:80])!r}")
        rest = bytes(self._head[end + 4 :])
        self._head.clear()
        self.upgraded.set_result(int(line[1]))
        return rest

    def _answered(self, f: frames.Frame) -> None:
        call_id, _, status = f.head.partition(b" ")
        if not (call_id.isdigit() and status.isdigit()):
            raise frames.ChannelProtocolError(f"an answer's head is not '<id> <status>': {f.head[:80]!r}")
        waiter = self.waiters.pop(int(call_id), None)
        if waiter is None or waiter.done():
            return  # its caller stopped waiting (timed out, cancelled)
        if f.body is None:
            waiter.set_exception(httpx.RemoteProtocolError(f"an answer of {f.size} bytes is over {MAX_ANSWER}"))
            return
        code = int(status)
        waiter.set_result(Answer(code, frames.status_phrase(code), [], f.body))

    def connection_lost(self, exc: Exception | None) -> None:
        self.close(httpx.ReadError(f"the call channel to the server closed{f': {exc}' if exc else ''}"))

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    async def send(self, data: bytes) -> None:
        if not self._writable.is_set():
            await self._writable.wait()
        if not self.open:
            raise httpx.ReadError("the call channel to the server closed")
        self._writer.write(data)

    def close(self, error: Exception) -> None:
        self.open = False
        if self.loop.is_closed():  # nothing of it can run any more; its socket closes with the transport
            self.waiters.clear()
            return
        self._writable.set()
        if not self.upgraded.done():
            self.upgraded.set_exception(error)
        waiters, self.waiters = self.waiters, {}
        for waiter in waiters.values():
            if not waiter.done():
                waiter.set_exception(error)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


class CallChannel:
    """Calls to one server over one upgraded connection; ``head`` holds the request headers
    every call carries (``Host``, ``Authorization``...), as ``name: value\\r\\n`` lines."""

    def __init__(self, origin: tuple[str, int], path_prefix: str, head: str, *, connect_timeout_s: float) -> None:
        self.origin = origin
        self.available = True
        """False once the server answered that it has no channel."""
        self.connect_timeout_s = connect_timeout_s
        self._upgrade = (
            f"GET {path_prefix}{frames.CHANNEL_PATH} HTTP/1.1\r\n{head}"
            f"connection: upgrade\r\nupgrade: {frames.UPGRADE.decode()}\r\n\r\n"
        ).encode()
        self._conn: _Connection | None = None
        self._opening: asyncio.Future[_Connection | None] | None = None
        self._ids = itertools.count(1)

    async def fetch(self, method: str, target: str, body: bytes, *, timeout: float | None) -> Answer | None:
        """The call's whole answer, or None when the server has no channel (send the call over HTTP)."""
        conn = await self._connection()
        if conn is None:
            return None
        call_id = next(self._ids)
        waiter: asyncio.Future[Answer] = conn.loop.create_future()
        conn.waiters[call_id] = waiter
        try:
            await conn.send(frames.call_frame(call_id, method, target, body))
            async with asyncio.timeout(timeout):
                return await waiter
        except TimeoutError:
            raise httpx.ReadTimeout(f"no answer within {timeout} s") from None
        finally:
            conn.waiters.pop(call_id, None)

    async def _connection(self) -> _Connection | None:
        conn = self._conn
        if conn is not None and conn.open:
            if conn.loop is asyncio.get_running_loop():
                return conn
            conn.open = False  # made on a loop before this one (a new asyncio.run): its transport went with it
        if not self.available:
            return None
        if self._opening is None or self._opening.get_loop() is not asyncio.get_running_loop():
            self._opening = opening = asyncio.ensure_future(self._open())
            opening.add_done_callback(self._opened)
        return await asyncio.shield(self._opening)

    def _opened(self, opening: asyncio.Future[_Connection | None]) -> None:
        if self._opening is opening:
            self._opening = None
        if not opening.cancelled():
            opening.exception()  # retrieved here too: every caller that waited for it may have gone

    async def _open(self) -> _Connection | None:
        host, port = self.origin
        conn = _Connection()
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                transport, _ = await loop.create_connection(lambda: conn, host, port)
                transport.write(self._upgrade)
                status = await conn.upgraded
        except TimeoutError:
            conn.close(httpx.ConnectTimeout("timed out"))
            raise httpx.ConnectTimeout(
                f"cannot open a call channel to {host}:{port} within {self.connect_timeout_s} s"
            ) from None
        except OSError as exc:
            conn.close(httpx.ConnectError(str(exc)))
            raise httpx.ConnectError(f"cannot connect to {host}:{port}: {exc}") from exc
        except (httpx.ReadError, httpx.RemoteProtocolError) as exc:
            raise httpx.ConnectError(f"the server at {host}:{port} closed the call channel's upgrade: {exc}") from exc
        if status == 101:
            self._conn = conn
            return conn
        conn.close(httpx.ConnectError("not upgraded"))
        if status < 500:  # an answer it will give again: this server has no channel for this client
            log.info("the server at %s:%d answered %d to the call channel: calls go over HTTP", host, port, status)
            self.available = False
        return None

    async def aclose(self) -> None:
        if self._conn is not None:
            self._conn.close(httpx.ReadError("the client closed the call channel"))
            self._conn = None
