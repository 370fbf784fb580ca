"""One sandbox wrapped in another: the protocol forwarded once, so a wrapper states only what it changes.

A wrapper (command admission in :mod:`sandrl.sandbox.admission`, a fleet's per-host accounting in
:mod:`sandrl.cluster.fleet`) subclasses :class:`DelegatingSandbox` and overrides a hook:
:meth:`~DelegatingSandbox._run_exec` around every command, :meth:`~DelegatingSandbox._run_file`
around every file transfer, or :meth:`~DelegatingSandbox.close`.

Only the :class:`~sandrl.sandbox.base.Sandbox` protocol is forwarded. A capability the inner
sandbox has beyond it (streaming, TTL changes) is not, on purpose: it would go around what the
wrapper adds (an admitted ``spawn`` would skip admission). A wrapper that offers one says so
by defining it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from sandrl.sandbox.base import MAX_READ_BYTES, ExecCall, ExecResult, Sandbox, SandboxBase
from sandrl.sandbox.command import Command

S = TypeVar("S", bound=Sandbox)
T = TypeVar("T")


class DelegatingSandbox(SandboxBase, Generic[S]):
    """A :class:`~sandrl.sandbox.base.Sandbox` that forwards every call to ``inner``."""

    def __init__(self, inner: S) -> None:
        self.inner = inner
        self.id = inner.id

    async def _exec(self, call: ExecCall) -> ExecResult:
        return await self._run_exec(call.command, lambda: call.run_in(self.inner))

    async def _run_exec(self, command: Command, run: Callable[[], Awaitable[ExecResult]]) -> ExecResult:
        """Every command passes here; ``run()`` runs it in the inner sandbox. Override to wrap it."""
        return await run()

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        await self._run_file(f"write_file {path}", lambda: self.inner.write_file(path, data, mode))

    async def read_file(self, path: str, *, max_bytes: int = MAX_READ_BYTES) -> bytes:
        return await self._run_file(f"read_file {path}", lambda: self.inner.read_file(path, max_bytes=max_bytes))

    async def _run_file(self, what: str, run: Callable[[], Awaitable[T]]) -> T:
        """Every file transfer (``what``: e.g. ``read_file /a``) passes here. Override to wrap it."""
        return await run()

    async def close(self) -> None:
        await self.inner.close()
