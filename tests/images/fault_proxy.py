"""A real HTTP reverse proxy on loopback in front of a registry, that injects faults on request.

Every request (method, path, query, headers with Authorization and Range, body) is forwarded to the
upstream registry and its response streamed back byte for byte (``aiter_raw``: no decoding). Told to,
the proxy answers the next N requests whose path matches a pattern with an error status (429 with a
``Retry-After``, 503, a 401 with the challenge a test wrote...) or a redirect instead of forwarding
them, cuts a response after K body bytes by closing
the connection, or stalls one for a while after K bytes. It records every request, so a test can
assert that a blob was fetched exactly once.

It is an ASGI app under uvicorn in a daemon thread (:class:`sandrl.background_server.BackgroundServer`).
A cut is the app returning before the body is complete: uvicorn then closes the connection (and logs
"ASGI callable returned without completing response." on ``uvicorn.error``; that line is the cut).

The proxy is for pulls: pushes through it work too, because a ``Location`` naming the registry is
rewritten to name the proxy, but request bodies are read whole before they are forwarded.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import httpx

from sandrl.background_server import BackgroundServer

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

log = logging.getLogger(__name__)

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "host"}
)
"""Headers of one connection, not of the message: never forwarded. (``host`` is the upstream's own.)"""

ERROR_CODES = {429: "TOOMANYREQUESTS", 503: "UNAVAILABLE", 500: "UNKNOWN", 401: "UNAUTHORIZED", 404: "BLOB_UNKNOWN"}


@dataclass
class _Fault:
    pattern: re.Pattern[str]
    method: str | None
    remaining: int
    status: int = 0  # answer with this status instead of forwarding
    retry_after: str | None = None
    headers: tuple[tuple[str, str], ...] = ()  # sent with that answer
    cut_after: int = -1  # forward, but close the connection after this many body bytes
    stall_after: int = -1  # forward, but stop sending for stall_s after this many body bytes
    stall_s: float = 0.0

    def matches(self, method: str, path: str) -> bool:
        return self.remaining > 0 and (self.method is None or self.method == method) and bool(self.pattern.search(path))


@dataclass
class ProxiedRequest:
    """One request the proxy received, and what became of it."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    """The request's headers, names in lower case (``range``, ``authorization``...)."""
    status: int = 0
    """The status sent back (0 if none was: the upstream could not be reached and the client saw 502)."""
    fault: str | None = None
    """``"status 429"``, ``"cut after K bytes"``, ``"stalled S s after K bytes"``, or None for a plain forward."""
    body_bytes: int = 0
    """Response body bytes sent to the client."""
    started: float = 0.0
    """``time.monotonic()`` when the request came (a test measures what was in flight at once)."""
    ended: float | None = None
    """When its response was sent whole, cut or failed (None: not yet)."""


class FaultProxy:
    """A loopback reverse proxy to ``upstream`` (``http://127.0.0.1:PORT``); start it, or use ``with``."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self._lock = threading.Lock()
        self._faults: list[_Fault] = []
        self._requests: list[ProxiedRequest] = []
        self._client: httpx.AsyncClient | None = None
        self._stopping = threading.Event()
        self._server = BackgroundServer(self, name="fault proxy")

    @property
    def url(self) -> str:
        return self._server.url

    @property
    def host(self) -> str:
        """``127.0.0.1:PORT``, as image references name it."""
        return f"{self._server.host}:{self._server.port}"

    def start(self) -> FaultProxy:
        self._server.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # a stalled response ends now, not after uvicorn's graceful-shutdown timeout
        self._server.stop()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # --- what a test tells it and asks it

    def fail_next(
        self,
        pattern: str,
        *,
        status: int = 429,
        times: int = 1,
        retry_after: str | None = "0",
        method: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        """Answer the next ``times`` requests whose path matches ``pattern`` (``re.search``) with ``status``
        (and ``headers``: a ``WWW-Authenticate`` challenge...).

        ``Retry-After`` is sent with a 429 or 503 unless ``retry_after`` is None; "0" keeps tests fast.
        """
        fault = _Fault(
            re.compile(pattern), method, times, status=status, retry_after=retry_after, headers=_pairs(headers)
        )
        with self._lock:
            self._faults.append(fault)

    def redirect_next(self, pattern: str, location: str, *, status: int = 307, times: int = 1) -> None:
        """Answer the next ``times`` matching requests with a redirect to ``location``, as Docker Hub
        sends a blob to its CDN. ``{path}`` in ``location`` is the request's path (``{url}``: the
        proxy's URL): a redirect to the proxy itself forwards on once the fault is spent."""
        with self._lock:
            fault = _Fault(re.compile(pattern), "GET", times, status=status, headers=(("location", location),))
            self._faults.append(fault)

    def cut_next(self, pattern: str, *, after_bytes: int, times: int = 1, method: str | None = "GET") -> None:
        """Forward the next ``times`` matching requests, but close the connection after ``after_bytes`` body bytes.

        A body no longer than ``after_bytes`` goes through whole; the fault is spent all the same.
        """
        with self._lock:
            self._faults.append(_Fault(re.compile(pattern), method, times, cut_after=after_bytes))

    def stall_next(
        self, pattern: str, *, seconds: float, after_bytes: int = 0, times: int = 1, method: str | None = "GET"
    ) -> None:
        """Forward the next ``times`` matching requests, but send nothing for ``seconds`` after ``after_bytes``
        body bytes (headers are sent first), then the rest: for a client's read timeout."""
        with self._lock:
            fault = _Fault(re.compile(pattern), method, times, stall_after=after_bytes, stall_s=seconds)
            self._faults.append(fault)

    @property
    def requests(self) -> list[ProxiedRequest]:
        with self._lock:
            return list(self._requests)

    @property
    def counts(self) -> Counter[tuple[str, str]]:
        """Requests received per (method, path), faulted ones included."""
        with self._lock:
            return Counter((r.method, r.path) for r in self._requests)

    def count(self, method: str, pattern: str) -> int:
        """How many ``method`` requests had a path matching ``pattern`` (``re.search``)."""
        regex = re.compile(pattern)
        return sum(n for (m, path), n in self.counts.items() if m == method and regex.search(path))

    @property
    def pending_faults(self) -> int:
        """Faults told and not yet spent."""
        with self._lock:
            return sum(f.remaining for f in self._faults)

    def reset(self) -> None:
        """Forget the faults not yet spent and the requests seen."""
        with self._lock:
            self._faults.clear()
            self._requests.clear()

    # --- the ASGI app

    def _take_fault(self, method: str, path: str) -> _Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.matches(method, path):
                    fault.remaining -= 1
                    return fault
            return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._proxy(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                # No timeout on reads: a test that stalls a download decides how long it waits, not the proxy.
                self._client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=5.0), trust_env=False)
                self._client.headers.clear()  # send what the client sent, not httpx's defaults
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._client is not None:
                    await self._client.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _proxy(self, scope: Scope, receive: Receive, send: Send) -> None:
        method: str = scope["method"]
        path: str = scope["path"]
        query = scope["query_string"].decode("latin-1")
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        record = ProxiedRequest(method, path, query, {k.lower(): v for k, v in headers}, started=time.monotonic())
        with self._lock:
            self._requests.append(record)
        try:
            await self._forward(scope, receive, send, record)
        finally:
            record.ended = time.monotonic()

    async def _forward(self, scope: Scope, receive: Receive, send: Send, record: ProxiedRequest) -> None:
        method, path, query = record.method, record.path, record.query
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        fault = self._take_fault(method, path)
        if fault is not None and fault.status:
            record.fault = f"status {fault.status}"
            await self._answer_error(send, record, fault, path)
            return

        body = bytearray()
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        raw_path = scope.get("raw_path") or path.encode()
        url = self.upstream + raw_path.decode("latin-1") + (f"?{query}" if query else "")
        forward = [(k, v) for k, v in headers if k.lower() not in HOP_BY_HOP and k.lower() != "content-length"]
        assert self._client is not None
        request = self._client.build_request(method, url, headers=forward, content=bytes(body) if body else None)
        try:
            response = await self._client.send(request, stream=True)
        except httpx.TransportError as e:
            log.warning("fault proxy: %s %s: upstream failed: %r", method, path, e)
            await send({"type": "http.response.start", "status": 502, "headers": []})
            await send({"type": "http.response.body", "body": repr(e).encode()})
            return
        try:
            await send({"type": "http.response.start", "status": response.status_code, "headers": self._out(response)})
            record.status = response.status_code
            cut = fault.cut_after if fault is not None else -1
            stall = fault.stall_after if fault is not None else -1
            async for chunk in response.aiter_raw():
                if 0 <= stall < record.body_bytes + len(chunk):
                    part = chunk[: stall - record.body_bytes]
                    await send({"type": "http.response.body", "body": part, "more_body": True})
                    record.body_bytes += len(part)
                    chunk = chunk[len(part) :]
                    assert fault is not None
                    record.fault = f"stalled {fault.stall_s:g} s after {stall} bytes"
                    await self._stall(fault.stall_s)
                    stall = -1
                if 0 <= cut < record.body_bytes + len(chunk):
                    part = chunk[: cut - record.body_bytes]
                    await send({"type": "http.response.body", "body": part, "more_body": True})
                    record.body_bytes += len(part)
                    record.fault = f"cut after {cut} bytes"
                    log.warning("fault proxy: cut %s %s after %d bytes", method, path, cut)
                    return  # without the last body message: uvicorn closes the connection
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                record.body_bytes += len(chunk)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await response.aclose()

    async def _stall(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not self._stopping.is_set():
            await asyncio.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    def _out(self, response: httpx.Response) -> list[tuple[bytes, bytes]]:
        out = []
        for name, value in response.headers.multi_items():
            lower = name.lower()
            if lower in HOP_BY_HOP or lower == "date":  # uvicorn sends its own Date
                continue
            if lower == "location" and value.startswith(self.upstream):
                value = self.url + value[len(self.upstream) :]
            out.append((lower.encode("latin-1"), value.encode("latin-1")))
        return out

    async def _answer_error(self, send: Send, record: ProxiedRequest, fault: _Fault, path: str) -> None:
        code = ERROR_CODES.get(fault.status, "UNKNOWN")
        body = json.dumps({"errors": [{"code": code, "message": "injected by the fault proxy", "detail": None}]})
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if fault.retry_after is not None and fault.status in (429, 503):
            headers.append((b"retry-after", fault.retry_after.encode()))
        for name, value in fault.headers:
            value = value.replace("{path}", path).replace("{url}", self.url)
            headers.append((name.lower().encode("latin-1"), value.encode("latin-1")))
        await send({"type": "http.response.start", "status": fault.status, "headers": headers})
        await send({"type": "http.response.body", "body": body.encode() if record.method != "HEAD" else b""})
        record.status = fault.status
        record.body_bytes = len(body) if record.method != "HEAD" else 0


def _pairs(headers: dict[str, str] | None) -> tuple[tuple[str, str], ...]:
    return tuple((headers or {}).items())
