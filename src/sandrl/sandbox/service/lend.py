"""Lend a live sandbox to another process: a loopback sandbox service that holds just that sandbox.

An external harness in a Python of its own (Harbor's Terminus-2, in Harbor's 3.12 virtualenv)
must act in the episode's sandbox, which this process made and will verify and close. :func:`lend`
serves that sandbox through the native API on a free loopback port, with a bearer token of its
own, for as long as the context lasts.

A loan lends commands and files, nothing of the sandbox's life. The borrower holds code the
policy wrote, so what it may do is an allow-list, held twice:

- the service holds the sandbox as :class:`Lent`, which has the sandbox's commands (``exec``,
  streamed ``spawn``) and files (read and write, streamed when the sandbox streams) and nothing
  else: no TTL, pause, resume, snapshot, fork or close (a delete only forgets it here), on any
  Python (nothing is forwarded by name, so no capability protocol matches it by accident);
- the loan's server answers only :data:`LENT_ROUTES` (a look at the sandbox, exec, exec/stream,
  files, tar, ``/healthz``): every other route of the service, the E2B API and envd's included,
  is refused with 403 ``not_lent`` before it reaches the app.

When the loan ends the sandbox is forgotten by the service and is the episode's as it was lent:
thawed if it was paused meanwhile, its TTL back to what it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Unpack

from sandrl.errors import CapacityExhaustedError
from sandrl.sandbox.base import (
    MAX_READ_BYTES,
    ImageSource,
    Pausable,
    Sandbox,
    SandboxProcess,
    SandboxSpec,
    prebuilt_image,
)
from sandrl.sandbox.command import Command
from sandrl.sandbox.delegating import DelegatingSandbox
from sandrl.sandbox.remote.wire import API_PREFIX
from sandrl.sandbox.service.auth import ASGIApp, Receive, Scope, Send, send_error
from sandrl.sandbox.service.state import SandboxService, SpawnOptions, StreamingSandbox

log = logging.getLogger("sandrl.service")

LENT_ROUTES = {
    "GET": re.compile(rf"/healthz|{API_PREFIX}/sandboxes/[^/]+(/files|/tar)?"),
    "POST": re.compile(rf"{API_PREFIX}/sandboxes/[^/]+/exec(/stream)?"),
    "PUT": re.compile(rf"{API_PREFIX}/sandboxes/[^/]+/(files|tar)"),
}
"""What the loan's server answers, by method: the whole path (as routed, i.e. unquoted) must match."""


class Lent(DelegatingSandbox[Sandbox]):
    """The lent sandbox as the loan's service holds it: commands and files, and a ``close`` that only
    lets go (the sandbox is the episode's to close)."""

    @property
    def close_reason(self) -> str:
        """Why the sandbox ended, for the service's 'gone' message (not a power)."""
        return str(getattr(self.inner, "close_reason", ""))

    async def close(self) -> None:
        """The borrower's delete: nothing happens to the sandbox."""


class StreamingLent(Lent):
    """:class:`Lent` of a sandbox that streams: also a command's output as it comes, and files in windows."""

    def __init__(self, inner: Sandbox) -> None:
        super().__init__(inner)
        assert isinstance(inner, StreamingSandbox)
        self._streaming: StreamingSandbox = inner

    async def spawn(self, command: Command, **options: Unpack[SpawnOptions]) -> SandboxProcess:
        return await self._streaming.spawn(command, **options)

    async def write_file_stream(self, path: str, chunks: AsyncIterator[bytes], mode: int = 0o644) -> int:
        return await self._streaming.write_file_stream(path, chunks, mode)

    def read_file_stream(self, path: str, *, max_bytes: int = MAX_READ_BYTES) -> AsyncIterator[bytes]:
        return self._streaming.read_file_stream(path, max_bytes=max_bytes)


def lent(sandbox: Sandbox) -> Lent:
    """What a loan of ``sandbox`` gives its borrower (see the module)."""
    return StreamingLent(sandbox) if isinstance(sandbox, StreamingSandbox) else Lent(sandbox)


class LentRoutes:
    """The loan's server in front of the service's app: :data:`LENT_ROUTES`, and 403 ``not_lent`` for the rest."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            method, path = scope["method"], scope["path"]
            pattern = LENT_ROUTES.get(method)
            envd = any(name == b"e2b-sandbox-id" for name, _ in scope.get("headers", ()))
            if envd or pattern is None or scope.get("root_path") or not pattern.fullmatch(path):
                message = (
                    f"{method} {path} is not lent: a loan lends the sandbox's commands and files "
                    "(exec, exec/stream, files, tar), not its life (TTL, pause, snapshot, fork, delete) or others"
                )
                await send_error(send, 403, "not_lent", message)
                return
        await self.app(scope, receive, send)


class _OneSandbox:
    """A provider with one sandbox to give: the lent one."""

    def __init__(self, lent: Lent) -> None:
        self._lent: Lent | None = lent

    async def create(self, spec: SandboxSpec) -> Any:
        lent, self._lent = self._lent, None
        if lent is None:
            raise CapacityExhaustedError("this service lends one existing sandbox and makes no other")
        return lent

    async def resolve_image(self, source: ImageSource) -> str:
        return prebuilt_image(source)


@dataclass(frozen=True)
class Loan:
    """Where the borrower finds the sandbox."""

    url: str
    token: str
    sandbox_id: str


@dataclass(frozen=True)
class _AsLent:
    """What the loan gives back: whether the sandbox was paused, and when it was to expire."""

    paused: bool
    expires_at: float | None

    @classmethod
    def of(cls, sandbox: Sandbox) -> _AsLent:
        expires_at = getattr(sandbox, "expires_at", None)
        paused = isinstance(sandbox, Pausable) and sandbox.paused
        return cls(paused, float(expires_at) if isinstance(expires_at, int | float) else None)

    async def restore(self, sandbox: Sandbox) -> None:
        """Put ``sandbox`` back as it was lent, if the borrower reached it some other way."""
        if isinstance(sandbox, Pausable) and sandbox.paused and not self.paused:
            await sandbox.resume()
        set_ttl = getattr(sandbox, "set_ttl", None)
        now_expires = getattr(sandbox, "expires_at", None)
        if self.expires_at is None or not callable(set_ttl) or not isinstance(now_expires, int | float):
            return
        if abs(now_expires - self.expires_at) > 1.0 and not (isinstance(sandbox, Pausable) and sandbox.paused):
            await set_ttl(max(self.expires_at - time.time(), 1.0))


@contextlib.asynccontextmanager
async def lend(sandbox: Sandbox) -> AsyncIterator[Loan]:
    """Serve ``sandbox`` on a loopback port of this event loop until the context ends (see the module)."""
    from sandrl.background_server import serve_on_loop
    from sandrl.sandbox.service.server import create_app

    as_lent = _AsLent.of(sandbox)
    service = SandboxService(_OneSandbox(lent(sandbox)))
    service.loop = asyncio.get_running_loop()
    spec: SandboxSpec = getattr(sandbox, "spec", None) or SandboxSpec()
    spec = dataclasses.replace(spec, ttl_s=min(spec.ttl_s, service.config.max_ttl_s))
    entry = await service.create(spec, {"sandrl.lent": "1"})
    token = secrets.token_hex(24)
    app = create_app(service, token=token)
    app.add_middleware(LentRoutes)  # outermost: what is not lent reaches nothing of the app
    try:
        async with serve_on_loop(app, name="sandbox loan") as url:
            yield Loan(url, token, entry.id)
    finally:
        service.entries.pop(entry.id, None)
        if entry.timer is not None:
            entry.timer.cancel()
        if not getattr(sandbox, "closed", False):
            try:
                await asyncio.shield(as_lent.restore(sandbox))
            except Exception as exc:  # the episode goes on and finds out for itself
                log.warning("sandbox %s could not be put back as it was lent: %s", sandbox.id, exc)
