"""The sandbox service over HTTP: ``sandrl serve sandboxes``.

The native JSON API lives under ``/v1`` in :data:`router` (the routes are in
:mod:`sandrl.sandbox.service.routes`); an E2B-compatible router can be added to the same
app with ``app.include_router`` and share its service, auth and metrics. Open routes:
``GET /healthz``. Behind the bearer token: everything else, ``/metrics`` (Prometheus) and
``/openapi.json`` included. Errors are ``{"code", "error_code", "message"}`` everywhere.

:func:`serve` runs it with uvicorn over the bubblewrap provider: the provider reaps what a
crashed predecessor left when it starts; SIGTERM (or Ctrl-C) drains: new creates are refused,
requests in flight get ``drain_grace_s`` to finish, then every sandbox is closed.
:class:`BackgroundServer` runs an app in a thread on a free port (tests, one-process setups).

Both run uvicorn with :func:`http_protocol`: it opens the call channel on an upgrade to it
(:mod:`sandrl.sandbox.service.channel`), a connection must finish its request headers within
``header_timeout_s`` (uvicorn itself only times idle keep-alive connections, so a client that
sends half a request line would hold a connection and its memory forever), and once the app has
answered a request whose body it did not read (refused up front, cut at a limit, a write that
failed), the rest of that body is dropped as it arrives, :data:`DISCARD_AFTER_ANSWER` bytes
and :data:`LINGER_S` at most, then the connection is closed.

Threat model of the service (the sandboxes' own is in :mod:`sandrl.sandbox.bwrap`). Clients
holding the token are trusted to use sandboxes, not to harm the host: every body is bounded
(requests by size before any read; uploads by the sandbox's ``disk_mb`` before bytes reach the
host, never spooled to the host's disk or memory, gzip inflation included; downloads by
``max_file_bytes``), output and tar downloads are paced by their reader (a client that stops
reading stalls its command, not the server's memory), and header reads time out. Without a token
(loopback only) the server answers only loopback ``Host`` names and no request with an ``Origin``
(a browser page, e.g. after DNS rebinding); any local process is trusted as before. envd
(E2B) requests are refused before their body is read unless their token matches, and an unknown
sandbox id is answered exactly as a wrong token, so ids cannot be probed. The call channel
(:mod:`.channel`) is opened only when the app answers its upgrade as it would any request with
those headers (loopback names, no ``Origin``, the token), its calls carry them, and each call's
body is bounded as HTTP's. Not covered: a client that trickles a body slowly (or a channel's
frame) is not timed (only its headers are), and timing of refusals is close to but not proven
constant.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from sandrl import __version__
from sandrl.background_server import BackgroundServer as _BackgroundServer
from sandrl.errors import SandboxFileError, SandrlError
from sandrl.sandbox.base import SandboxProvider
from sandrl.sandbox.remote.frames import UPGRADE as CHANNEL_UPGRADE
from sandrl.sandbox.remote.wire import API_PREFIX, Health
from sandrl.sandbox.service.auth import BearerAuth, BodyLimit, LoopbackOnly, bind_host, load_token
from sandrl.sandbox.service.channel import start_channel
from sandrl.sandbox.service.e2b import mount as mount_e2b
from sandrl.sandbox.service.hot_routes import HotCalls, HotRoutes
from sandrl.sandbox.service.metrics import CONTENT_TYPE
from sandrl.sandbox.service.routes import ERRORS, document_bearer, router, service_of
from sandrl.sandbox.service.state import SandboxService, ServiceConfig

log = logging.getLogger("sandrl.service")
DEFAULT_PORT = 8700
HEADER_TIMEOUT_S = 10.0
"""How long a connection may take to send a request's headers."""
DISCARD_AFTER_ANSWER = 64 << 20
LINGER_S = 10.0
"""After answering a request whose body it has not read, the server still reads (and drops) up
to this many bytes of it for up to this long, then closes the connection: most clients send
their whole body before they read, and closing at once would reset the connection under the
answer (as nginx's lingering close). Dropped bytes touch neither memory nor disk."""


def http_protocol(header_timeout_s: float = HEADER_TIMEOUT_S) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with a header timeout and a bounded lingering read after an early answer."""
    import httptools
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class ServiceHttpProtocol(HttpToolsProtocol):
        _header_timer: asyncio.TimerHandle | None = None
        _linger_timer: asyncio.TimerHandle | None = None
        _dropped = 0

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._header_timer = self.loop.call_later(header_timeout_s, self._close)

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_timers()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(header_timeout_s, self._close)

        def on_headers_complete(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None
            super().on_headers_complete()
            if self.cycle is not None and not (self.parser.should_upgrade() and self._should_upgrade()):
                self.cycle.transport = HeadWithBody(self.transport, self.loop)

        def _should_upgrade(self) -> bool:
            return self._get_upgrade() == CHANNEL_UPGRADE or super()._should_upgrade()

        def data_received(self, data: bytes) -> None:
            # uvicorn's, but an upgrade to the call channel is opened here (and the offset of its
            # first bytes kept), not handed to a WebSocket protocol.
            self._unset_keepalive_if_required()
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserError:
                msg = "Invalid HTTP request received."
                self.logger.warning(msg)
                self.send_400_response(msg)
            except httptools.HttpParserUpgrade as upgrade:
                if self._get_upgrade() == CHANNEL_UPGRADE:
                    offset = int(upgrade.args[0]) if upgrade.args else len(data)
                    self.transport.pause_reading()
                    start_channel(self, data[offset:])
                else:
                    self._unsupported_upgrade_warning()

        def on_body(self, body: bytes) -> None:
            if self.cycle is not None and self.cycle.response_complete:
                self._dropped += len(body)
                if self._dropped > DISCARD_AFTER_ANSWER:
                    self._close()
                return
            super().on_body(body)

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._dropped = 0
            if self._linger_timer is not None:
                self._linger_timer.cancel()
                self._linger_timer = None

        def on_response_complete(self) -> None:
            super().on_response_complete()
            cycle = self.cycle
            if cycle is not None and cycle.more_body and self._linger_timer is None:
                self._linger_timer = self.loop.call_later(LINGER_S, self._close)

        def _cancel_timers(self) -> None:
            for timer in (self._header_timer, self._linger_timer):
                if timer is not None:
                    timer.cancel()
            self._header_timer = self._linger_timer = None

        def _close(self) -> None:
            self._cancel_timers()
            if not self.transport.is_closing():
                self.transport.close()

    return ServiceHttpProtocol


class HeadWithBody(asyncio.Transport):
    """A response's transport that sends its head with the first write of its body, in one segment.

    uvicorn writes a response's head as soon as the app starts the response, then each body chunk:
    two sends, and two wake-ups of the client, for every small JSON answer. The head is held until
    the next write, or the end of the event loop's turn at the latest, so a streamed response's
    head is not held back waiting for its first chunk.
    """

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._head: bytes | None = None
        self._held = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._held:
            self._held = True
            self._head = bytes(data)
            self._loop.call_soon(self.flush)
            return
        if self._head is not None:
            data, self._head = self._head + data, None
        self._transport.write(data)

    def flush(self) -> None:
        if self._head is not None:
            head, self._head = self._head, None
            if not self._transport.is_closing():
                self._transport.write(head)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)


class BackgroundServer(_BackgroundServer):
    """:class:`sandrl.background_server.BackgroundServer` with the service's HTTP protocol (:func:`http_protocol`)."""

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        name: str = "sandbox server",
        header_timeout_s: float = HEADER_TIMEOUT_S,
    ) -> None:
        super().__init__(app, host, port, name=name)
        self._server.config.http = http_protocol(header_timeout_s)


def create_app(service: SandboxService, *, token: str | None) -> FastAPI:
    """The FastAPI app serving ``service``; its shutdown drains and closes every sandbox."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service.loop = asyncio.get_running_loop()
        try:
            yield
        finally:
            await service.shutdown()

    app = FastAPI(
        title="sandrl sandbox service",
        version=__version__,
        description="Isolated Linux sandboxes over HTTP. Every route but /healthz needs "
        "'Authorization: Bearer <token>'.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.state.service = service
    app.include_router(router)
    make_schema = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document_bearer(make_schema())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.get("/healthz", response_model=Health, tags=["service"], responses={503: ERRORS[503]})
    async def healthz(request: Request) -> JSONResponse:
        svc = service_of(request)
        status = "draining" if svc.draining else "ok"
        body = Health(status=status, live=len(svc.entries), version=__version__)
        return JSONResponse(body.model_dump(), status_code=503 if svc.draining else 200)

    @app.get(
        "/metrics",
        tags=["service"],
        response_class=Response,
        responses={200: {"content": {CONTENT_TYPE: {"schema": {"type": "string"}}}}, 401: ERRORS[401]},
    )
    async def metrics(request: Request) -> Response:
        """Prometheus: live sandboxes, creates, create and exec latency, failures by error_code, host pressure."""
        return Response(service_of(request).metrics.render(), media_type=CONTENT_TYPE)

    failures = service.metrics.failures

    def answer(status: int, error_code: str, message: str) -> JSONResponse:
        failures.labels(error_code).inc()
        return JSONResponse({"code": status, "error_code": error_code, "message": message}, status_code=status)

    @app.exception_handler(SandrlError)
    async def sandrl_error(request: Request, exc: SandrlError) -> JSONResponse:
        if isinstance(exc, SandboxFileError) and exc.errno == errno.ENOENT:
            return answer(404, "file_not_found", exc.message + ": check the path (relative paths start at the workdir)")
        if isinstance(exc, SandboxFileError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return answer(
                507, "disk_full", exc.message + ": free space in the sandbox or create it with a larger disk_mb"
            )
        return answer(exc.http_status, exc.error_code, exc.message)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err.get('loc', ()) if p != 'body') or 'body'}: {err.get('msg')}"
            for err in exc.errors()
        )
        is_create = request.method == "POST" and request.url.path.rstrip("/") == f"{API_PREFIX}/sandboxes"
        code = "invalid_spec" if is_create else "invalid_request"
        return answer(400, code, f"invalid request: {problems} (the OpenAPI document at /openapi.json has the shapes)")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            return answer(404, "not_found", f"no route {request.url.path}: the API is under {API_PREFIX}/sandboxes")
        if exc.status_code == 405:
            return answer(405, "method_not_allowed", f"{request.method} is not allowed on {request.url.path}")
        if exc.status_code == 413:
            return answer(413, "payload_too_large", str(exc.detail))
        return answer(
            exc.status_code, "invalid_request" if exc.status_code < 500 else "internal_error", str(exc.detail)
        )

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error on %s %s", request.method, request.url.path)
        return answer(500, "internal_error", f"internal error: {exc!r}; the server log has the traceback")

    cfg = service.config

    def limit_for(path: str) -> int:
        return cfg.max_file_bytes if path.endswith(("/files", "/tar")) else cfg.max_json_bytes

    # Innermost: the hot routes skip FastAPI's routing, behind the same auth and body limits (:mod:`.hot_routes`).
    app.state.hot_calls = hot_calls = HotCalls(service, app.exception_handlers)
    app.add_middleware(HotRoutes, calls=hot_calls)
    app.add_middleware(BodyLimit, limit_for=limit_for)
    app.add_middleware(BearerAuth, token=token, on_refused=lambda code: failures.labels(code).inc())
    mount_e2b(app, service, token=token)  # its gateway goes in front of the bearer auth
    if token is None:
        app.add_middleware(LoopbackOnly, on_refused=lambda code: failures.labels(code).inc())  # outermost
    return app


class _DrainingServer(uvicorn.Server):
    """uvicorn, but the first SIGTERM/SIGINT also stops the service taking new sandboxes."""

    def __init__(self, config: uvicorn.Config, service: SandboxService) -> None:
        super().__init__(config)
        self.service = service

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.service.draining = True
        super().handle_exit(sig, frame)


def serve(
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    *,
    token_file: Path | str | None = None,
    max_live: int | None = None,
    state_dir: Path | str | None = None,
    config: ServiceConfig | None = None,
    provider: SandboxProvider | None = None,
    log_level: str = "info",
    egress_allow: list[str] | None = None,
) -> None:
    """Serve sandboxes until SIGTERM or Ctrl-C (``sandrl serve sandboxes``).

    The token comes from ``token_file`` or ``$SANDRL_TOKEN``; without one only loopback is served.
    ``egress_allow``: private ranges sandboxes with the network may reach (default
    ``$SANDRL_EGRESS_ALLOW``; :mod:`sandrl.sandbox.bwrap.egress`).
    """
    from dataclasses import replace

    from sandrl.sandbox.bwrap import BwrapProvider

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    token = load_token(token_file)
    host, warning = bind_host(host, token)
    if warning:
        log.warning(warning)
    cfg = config or ServiceConfig()
    if max_live is not None:
        cfg = replace(cfg, max_live=max_live)
    service = SandboxService(provider or BwrapProvider(state_dir, egress_allow=egress_allow or None), cfg)
    app = create_app(service, token=token)
    log.info("serving sandboxes on http://%s:%d (%s)", host, port, "bearer token" if token else "no auth")
    uv = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        ws="none",
        access_log=False,
        timeout_graceful_shutdown=max(1, round(cfg.drain_grace_s)),
        timeout_keep_alive=30,
        backlog=4096,
        http=http_protocol(),
        # Nothing here reads the client's address, so X-Forwarded-* is not trusted from anyone
        # (uvicorn trusts it from loopback by default): one layer less on every request.
        proxy_headers=False,
    )
    _collect_less()
    _DrainingServer(uv, service).run()


def _collect_less() -> None:
    """Move what start-up made out of the cyclic collector's way, and collect the young less often.

    Every request allocates container objects (frames of coroutines, dicts, futures), and with
    hundreds of sandboxes live the collector's passes over the long-lived ones grow. Same run,
    bursts of 256 clients (create, 5 execs, close): the server's CPU per cycle 6.3-6.6 ms with this,
    6.4-7.3 ms without; throughput 83-86 against 76-84 cycles/s. Garbage without cycles is freed at
    once either way; only cycles wait a little longer."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
