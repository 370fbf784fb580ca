"""The router's hot path to an engine: keep-alive HTTP/1.1 connections, parsed with httptools.

Every generation call of a run passes here, so it costs what the router's target allows (<= 1 ms a
call): httpx spends about half a millisecond of CPU on a request (URL objects, header models,
decoders, its pool's bookkeeping), this a tenth of that. The router's rare calls (control routes,
health, replays) use httpx.

An engine's answer is read as it comes (:meth:`Answer.chunks`), so streams pass through. What tells
the router an engine is gone (:class:`EngineGone`): a refused or failed connect, a connection closed
or reset before the answer's head, or an answer broken off. A connection the engine closed while it
sat idle in the pool (the server's keep-alive timeout) is not that: a request whose reused
connection ends before any byte of an answer is sent again once on a new connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httptools

from sandrl.errors import InferenceError

IDLE_S = 4.0
"""A pooled connection idle longer than this is closed rather than reused (uvicorn closes at 5 s)."""
MAX_IDLE = 64
CONNECT_TIMEOUT_S = 5.0
READ_BYTES = 65536


class EngineGone(InferenceError):
    """The engine cannot be reached, or dropped the connection before its answer was whole."""


@dataclass
class _Parsed:
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    chunks: list[bytes] = field(default_factory=list)
    head: bool = False
    done: bool = False
    keep_alive: bool = False
    parser: httptools.HttpResponseParser | None = None

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.head = True
        # Asked now: once the message is complete the parser has reset and says False.
        self.keep_alive = self.parser is not None and self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        self.done = True


@dataclass
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    used_at: float = field(default_factory=time.monotonic)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


class Answer:
    """An engine's answer: its status and headers now, its body as it comes."""

    def __init__(
        self, pool: EnginePool, connection: _Connection, parser: httptools.HttpResponseParser, parsed: _Parsed
    ) -> None:
        self.status: int = parser.get_status_code()
        self.headers = parsed.headers
        self._pool = pool
        self._connection: _Connection | None = connection
        self._parser = parser
        self._parsed = parsed

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's pieces (de-chunked), until it is whole; :class:`EngineGone` if it breaks off."""
        parsed = self._parsed
        while True:
            while parsed.chunks:
                yield parsed.chunks.pop(0)
            if parsed.done:
                self._release()
                return
            assert self._connection is not None
            try:
                data = await self._connection.reader.read(READ_BYTES)
            except OSError as exc:
                self.close()
                raise EngineGone(f"{self._pool.url} broke off its answer ({type(exc).__name__})") from exc
            if not data:
                self.close()
                raise EngineGone(f"{self._pool.url} closed the connection in the middle of its answer")
            self._feed(data)

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    def _feed(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.close()
            raise EngineGone(f"{self._pool.url} sent an answer that is not HTTP: {exc}") from exc

    def _release(self) -> None:
        if self._connection is not None:
            if self._parsed.keep_alive:
                self._pool.put(self._connection)
            else:
                self._connection.close()
            self._connection = None

    def close(self) -> None:
        """Drop the connection (an answer not read to its end cannot share it again)."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None


class EnginePool:
    """Keep-alive connections to one engine; see the module docstring."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname is None:
            raise ValueError(f"the router reaches its engines over plain http://HOST:PORT, got {url!r}")
        self.url = url
        self.host = parts.hostname
        self.port = parts.port or 80
        self._idle: list[_Connection] = []

    async def request(self, method: str, target: str, headers: Sequence[tuple[bytes, bytes]], body: bytes) -> Answer:
        """Send one request; its :class:`Answer` once its head has come."""
        head = [f"{method} {target} HTTP/1.1\r\nhost: {self.host}:{self.port}\r\n".encode()]
        head += [b"%s: %s\r\n" % (k, v) for k, v in headers]
        head.append(b"content-length: %d\r\n\r\n" % len(body))
        message = b"".join(head) + body
        while True:
            connection, reused = self._take()
            if connection is None:
                connection = await self._open()
            connection.writer.write(message)
            parsed = _Parsed()
            parser = parsed.parser = httptools.HttpResponseParser(parsed)
            answered = False
            try:
                while not parsed.head:
                    data = await connection.reader.read(READ_BYTES)
                    if not data:
                        raise ConnectionResetError("closed before an answer")
                    answered = True
                    parser.feed_data(data)
            except (OSError, httptools.HttpParserError) as exc:
                connection.close()
                if reused and not answered:
                    continue  # the engine had closed the idle connection: once more on a new one
                raise EngineGone(f"{self.url} dropped the request ({type(exc).__name__}: {exc})") from exc
            return Answer(self, connection, parser, parsed)

    def _take(self) -> tuple[_Connection | None, bool]:
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if now - connection.used_at < IDLE_S and not connection.reader.at_eof():
                return connection, True
            connection.close()
        return None, False

    async def _open(self) -> _Connection:
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                reader, writer = await asyncio.open_connection(self.host, self.port)
        except (OSError, TimeoutError) as exc:
            raise EngineGone(f"{self.url} cannot be reached ({type(exc).__name__}: {exc})") from exc
        return _Connection(reader, writer)

    def put(self, connection: _Connection) -> None:
        connection.used_at = time.monotonic()
        if len(self._idle) < MAX_IDLE:
            self._idle.append(connection)
        else:
            connection.close()

    def close(self) -> None:
        for connection in self._idle:
            connection.close()
        self._idle.clear()
