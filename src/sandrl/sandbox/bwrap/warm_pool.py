"""Warm pools over a :class:`~sandrl.sandbox.bwrap.BwrapProvider`: sandboxes created ahead of demand.

A :class:`PooledProvider` keeps, per configured spec, a few sandboxes created ahead of
demand and refilled in the background, so ``create`` hands one out at once; specs without
a pool are created on demand. ``max_live`` bounds every sandbox it holds (idle ones in the
pools and handed-out ones together): at the bound ``create`` either fails with
:class:`~sandrl.errors.CapacityExhaustedError` or waits for a sandbox to close.

A pooled sandbox is as fresh as any other: it has run nothing before it is handed out, and
its TTL starts at hand-out. It is the bubblewrap backend's: it tracks its sandboxes through
:meth:`~sandrl.sandbox.bwrap.BwrapSandbox.add_close_callback`. Command admission over any
provider is :mod:`sandrl.sandbox.admission`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from collections.abc import Mapping
from typing import Literal

from sandrl.errors import CapacityExhaustedError, SandrlError
from sandrl.sandbox.base import ImageSource, SandboxSpec
from sandrl.sandbox.bwrap import premade
from sandrl.sandbox.bwrap.provider import BwrapProvider
from sandrl.sandbox.bwrap.sandbox import BwrapSandbox


def spec_key(spec: SandboxSpec) -> str:
    return json.dumps(spec.to_dict(), sort_keys=True)


class WarmPool:
    """Idle sandboxes of one spec, refilled in the background up to ``size``."""

    def __init__(self, owner: PooledProvider, spec: SandboxSpec, size: int) -> None:
        self.owner = owner
        self.spec = spec
        self.size = size
        self.idle: deque[BwrapSandbox] = deque()
        self.creating = 0
        self.failures = 0
        self.last_error: BaseException | None = None
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._holds: deque[tuple[asyncio.Future[None], float]] = deque()
        """Sandboxes handed out whose first command has not ended, each with the time the refill
        stops waiting for it (:data:`~sandrl.sandbox.bwrap.premade.REFILL_HOLD_S` after its take)."""

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._refill(), name="sandrl-pool-refill")

    def kick(self) -> None:
        self._changed.set()

    async def _held(self) -> None:
        """Wait until each sandbox handed out has run its first command (or its hold has passed): a
        refill's create (~3 ms of CPU in the provider, its helper and the kernel) would compete with
        that command, the one its caller waits for, on a small host's cores."""
        loop = asyncio.get_running_loop()
        while self._holds and not self._closing:
            ended, deadline = self._holds[0]
            left = deadline - loop.time()
            if not ended.done() and left > 0:
                await asyncio.wait([ended], timeout=left)
            if self._holds and self._holds[0][0] is ended:  # a take may have dropped it meanwhile
                self._holds.popleft()

    async def _refill(self) -> None:
        while True:
            while not self._closing and len(self.idle) + self.creating < self.size and self.owner._has_room():
                await self._held()
                if self._closing or len(self.idle) + self.creating >= self.size or not self.owner._has_room():
                    break
                self.creating += 1
                self.owner._reserved += 1
                try:
                    sandbox = await self.owner.provider.create(self.spec)
                except SandrlError as exc:
                    self.failures += 1
                    self.last_error = exc
                    await asyncio.sleep(min(5.0, 0.1 * 2 ** min(self.failures, 6)))  # back off, try again
                    continue
                finally:
                    self.creating -= 1
                    self.owner._reserved -= 1
                self.failures = 0
                self.owner._track(sandbox)
                self.idle.append(sandbox)
                self.owner._notify()
            if self._closing:
                return
            self._changed.clear()
            await self._changed.wait()

    async def wait_full(self, timeout_s: float = 60) -> None:
        """Wait until the pool holds ``size`` idle sandboxes (or as many as capacity allows)."""
        deadline = time.monotonic() + timeout_s
        while len(self.idle) < self.size and time.monotonic() < deadline:
            if not self.owner._has_room() and not self.creating:
                return
            await asyncio.sleep(0.005)

    def take(self) -> BwrapSandbox | None:
        while self.idle:
            sandbox = self.idle.popleft()
            if not sandbox.closed:
                now = asyncio.get_running_loop().time()
                while self._holds and (self._holds[0][0].done() or self._holds[0][1] <= now):
                    self._holds.popleft()  # a pool that cannot refill (max_live) keeps none of them
                self._holds.append((sandbox.first_command_ended, now + premade.REFILL_HOLD_S))
                self.kick()
                return sandbox
            self.kick()
        self.kick()
        return None

    async def close(self) -> None:
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            # A cancellation can be lost in a create that finished at that moment (Python 3.11's
            # asyncio.wait_for returns the result instead): the flag ends the loop then.
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        idle, self.idle = list(self.idle), deque()
        await asyncio.gather(*(s.close() for s in idle), return_exceptions=True)


class PooledProvider:
    """A :class:`~sandrl.sandbox.base.SandboxProvider` with warm pools and a bound on live sandboxes."""

    def __init__(
        self,
        provider: BwrapProvider,
        *,
        pools: Mapping[SandboxSpec, int] | list[tuple[SandboxSpec, int]] | None = None,
        max_live: int | None = None,
        on_full: Literal["error", "wait"] = "error",
        wait_timeout_s: float = 300.0,
    ) -> None:
        self.provider = provider
        self.max_live = max_live
        self.on_full = on_full
        self.wait_timeout_s = wait_timeout_s
        self.live: set[BwrapSandbox] = set()
        self._reserved = 0
        self._room = asyncio.Event()
        items = list(pools.items()) if isinstance(pools, Mapping) else list(pools or [])
        self.pools: dict[str, WarmPool] = {}
        for spec, size in items:
            if size < 0:
                raise ValueError("a pool size cannot be negative")
            self.pools[spec_key(spec)] = WarmPool(self, spec, size)
        for pool in self.pools.values():
            pool.start()

    def _has_room(self) -> bool:
        return self.max_live is None or len(self.live) + self._reserved < self.max_live

    def _track(self, sandbox: BwrapSandbox) -> None:
        self.live.add(sandbox)
        sandbox.add_close_callback(self._untrack)

    def _untrack(self, sandbox: BwrapSandbox) -> None:
        self.live.discard(sandbox)
        self._notify()
        for pool in self.pools.values():
            pool.kick()

    def _notify(self) -> None:
        self._room.set()

    async def resolve_image(self, source: ImageSource) -> str:
        return await self.provider.resolve_image(source)

    def pool(self, spec: SandboxSpec) -> WarmPool | None:
        return self.pools.get(spec_key(spec))

    async def create(self, spec: SandboxSpec | None = None) -> BwrapSandbox:
        spec = spec or SandboxSpec()
        pool = self.pool(spec)
        deadline = time.monotonic() + self.wait_timeout_s
        while True:
            if pool is not None:
                sandbox = pool.take()
                if sandbox is not None:
                    await sandbox.set_ttl_ahead(spec.ttl_s)  # its lifetime starts now, not when it was pooled
                    return sandbox
            if self._has_room():
                return await self._create_direct(spec)
            # Full: an idle sandbox of another spec gives its room to this one.
            if await self._evict_idle(except_pool=pool):
                continue
            if self.on_full == "error":
                raise CapacityExhaustedError(
                    f"{len(self.live)} sandboxes are live, the limit (max_live={self.max_live}); "
                    "close some, raise max_live, or use on_full='wait'"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CapacityExhaustedError(
                    f"waited {self.wait_timeout_s:g} s for room among {self.max_live} live sandboxes; "
                    "close some or raise max_live"
                )
            self._room.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._room.wait(), min(remaining, 1.0))

    async def _evict_idle(self, except_pool: WarmPool | None) -> bool:
        for pool in self.pools.values():
            if pool is not except_pool and pool.idle:
                await pool.idle.pop().close()
                return True
        return False

    async def _create_direct(self, spec: SandboxSpec) -> BwrapSandbox:
        self._reserved += 1
        try:
            sandbox = await self.provider.create(spec)
        finally:
            self._reserved -= 1
        self._track(sandbox)
        return sandbox

    async def close(self) -> None:
        """Close the pools' idle sandboxes and every sandbox handed out."""
        await asyncio.gather(*(p.close() for p in self.pools.values()))
        await asyncio.gather(*(s.close() for s in list(self.live)), return_exceptions=True)
