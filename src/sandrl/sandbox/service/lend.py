"""Lend a live sandbox to another process: a loopback sandbox service that holds just that sandbox.

An external harness in a Python of its own (Harbor's Terminus-2, in Harbor's 3.12 virtualenv)
must act in the episode's sandbox, which this process made and will verify and close. :func:`lend`
serves that sandbox through the native API (``/v1/sandboxes/{id}/exec``, ``/files``, ``/tar``) on
a free loopback port, with a bearer token of its own, for as long as the context lasts. The
borrower can run commands and move files; it cannot close the sandbox (a delete only forgets it
here) or create others (this service's provider has nothing more to give). When the loan ends the
sandbox is forgotten by the service and stays the episode's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from sandrl.errors import CapacityExhaustedError
from sandrl.sandbox.base import ImageSource, Sandbox, SandboxSpec, prebuilt_image
from sandrl.sandbox.service.state import SandboxService


class Lent:
    """The lent sandbox as the service holds it: everything goes to the sandbox, except ``close``."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox
        self.id = sandbox.id

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sandbox, name)

    async def close(self) -> None:
        """The borrower's delete: the sandbox is the episode's to close."""


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


@contextlib.asynccontextmanager
async def lend(sandbox: Sandbox) -> AsyncIterator[Loan]:
    """Serve ``sandbox`` on a loopback port of this event loop until the context ends (see the module)."""
    from sandrl.background_server import serve_on_loop
    from sandrl.sandbox.service.server import create_app

    service = SandboxService(_OneSandbox(Lent(sandbox)))
    service.loop = asyncio.get_running_loop()
    spec: SandboxSpec = getattr(sandbox, "spec", None) or SandboxSpec()
    spec = dataclasses.replace(spec, ttl_s=min(spec.ttl_s, service.config.max_ttl_s))
    entry = await service.create(spec, {"sandrl.lent": "1"})
    token = secrets.token_hex(24)
    try:
        async with serve_on_loop(create_app(service, token=token), name="sandbox loan") as url:
            yield Loan(url, token, entry.id)
    finally:
        service.entries.pop(entry.id, None)
        if entry.timer is not None:
            entry.timer.cancel()
