"""An ASGI app served by uvicorn: in a daemon thread (:class:`BackgroundServer`, for tests and
benchmarks) or on the caller's event loop (:func:`serve_on_loop`, for an app whose handlers await
objects bound to that loop, such as the session gateway in front of the embedded engine).

Neither trusts ``X-Forwarded-For`` (uvicorn does from loopback by default): the client address an
app sees is the connection's own, so a sandbox whose requests come through a port forward cannot
claim another address (:mod:`sandrl.peer_tags`)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from types import TracebackType
from typing import Any

import uvicorn


class _LoopServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # The process's Ctrl-C belongs to the command running this server, not to uvicorn.
        yield


_ROUTES_BUILT = threading.Lock()


def build_routes_now(app: Any) -> None:
    """Build a FastAPI app's routes before it serves. FastAPI builds an included router's routes at the first
    request that walks them, and two apps that include one module-level router (two servers in one process,
    each on its own thread) then build them at once: pydantic's schema generation is not thread-safe (a
    spurious warning, raised as an error under the tests' filters, answered a request 500). One at a time,
    here; an app or a FastAPI without lazy routes is left as it is."""
    router = getattr(app, "router", None)
    with _ROUTES_BUILT:
        for route in getattr(router, "routes", ()):
            for build in ("effective_candidates", "effective_low_priority_routes"):
                method = getattr(route, build, None)
                if callable(method):
                    method()


@contextlib.asynccontextmanager
async def serve_on_loop(app: Any, host: str = "127.0.0.1", *, name: str = "server") -> AsyncIterator[str]:
    """Serve ``app`` on this event loop on a free port of ``host``; yields its URL; stops on exit."""
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets that say TCP, and without it an answer
    # written in two parts (head, body) to a client on this same loop waits out a delayed ACK (~40 ms).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    build_routes_now(app)
    config = uvicorn.Config(app, log_level="warning", ws="none", lifespan="off", access_log=False, proxy_headers=False)
    server = _LoopServer(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                await task
                raise RuntimeError(f"the {name} on {host}:{port} stopped before it started")
            await asyncio.sleep(0.005)
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, timeout=10)
        sock.close()


class BackgroundServer:
    """Serve ``app`` in a daemon thread on a free port of 127.0.0.1 (or the host and port given);
    over TLS when given ``tls`` (a certificate chain file and its key file)."""

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        name: str = "server",
        tls: tuple[str, str] | None = None,
    ) -> None:
        self.name = name
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.host, self.port = self._sock.getsockname()[:2]
        self._scheme = "https" if tls is not None else "http"
        certfile, keyfile = tls if tls is not None else (None, None)
        config = uvicorn.Config(
            app,
            log_level="warning",
            ws="none",
            lifespan="on",
            access_log=False,
            proxy_headers=False,
            timeout_graceful_shutdown=10,
            ssl_certfile=certfile,
            ssl_keyfile=keyfile,
        )
        self._app = app
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    @property
    def url(self) -> str:
        return f"{self._scheme}://{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> BackgroundServer:
        build_routes_now(self._app)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the {self.name} on {self.url} did not start within {timeout_s:g} s")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=60)
        self._sock.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
