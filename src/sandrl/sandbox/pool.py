"""Warm pools and admission control over a sandbox provider.

A :class:`PooledProvider` keeps, per configured spec, a few sandboxes created ahead of
demand and refilled in the background, so ``create`` hands one out at once; specs without
a pool are created on demand. ``max_live`` bounds every sandbox it holds (idle ones in the
pools and handed-out ones together): at the bound ``create`` either fails with
:class:`~sandrl.errors.CapacityExhaustedError` or waits for a sandbox to close.

A pooled sandbox is as fresh as any other: it has run nothing before it is handed out, and
its TTL starts at hand-out.

:class:`CommandAdmission` bounds what a host's CPUs are asked to do at once: at most ``slots``
commands run across the sandboxes of an :class:`AdmittedProvider` (which wraps any provider,
this one included), the rest wait in FIFO order. A host's capacity within a latency bar is a
number of *busy* sandboxes (``sandrl bench contention``), and an episode is busy only while a
command runs, not while its agent waits on the model: so admission holds commands, not
sandboxes. The rollout runner takes it as ``RunnerConfig.host_capacity``. With ``fill_idle``
it is work-conserving: a waiting command also runs when cores sit idle (:mod:`sandrl.sandbox.idle_cpu`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Literal

from sandrl.errors import CapacityExhaustedError, ConfigError, SandboxError, SandrlError
from sandrl.sandbox.base import (
    ExecResult,
    ForwardedPort,
    ImageSource,
    PortForwardingProvider,
    Sandbox,
    SandboxProvider,
    SandboxSpec,
    SnapshotProvider,
    Snapshottable,
    forward_port,
    snapshots_of,
)
from sandrl.sandbox.bwrap import BwrapProvider, BwrapSandbox
from sandrl.sandbox.command import Command
from sandrl.sandbox.delegating import DelegatingSandbox
from sandrl.sandbox.idle_cpu import IdleCpus


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

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._refill(), name="sandrl-pool-refill")

    def kick(self) -> None:
        self._changed.set()

    async def _refill(self) -> None:
        while True:
            while not self._closing and len(self.idle) + self.creating < self.size and self.owner._has_room():
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
            self.kick()
            if not sandbox.closed:
                return sandbox
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
                    await sandbox.set_ttl(spec.ttl_s)  # its lifetime starts now, not when it was pooled
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


class CommandAdmission:
    """At most ``slots`` commands run at once; the rest wait for a slot, first come first served.

    ``wait_timeout_s`` bounds a wait (then :class:`~sandrl.errors.CapacityExhaustedError`), so
    nothing queues forever. The counters say what admission did: commands admitted, how many
    had to wait and for how long, the most running and waiting at once.

    ``fill_idle`` makes admission work-conserving: while commands wait and at least
    ``fill_idle_cores`` of the host's cores sat idle over the last window (the commands holding
    the slots are waiting on I/O, or the slots' episodes are between commands), the first
    waiter runs as an *extra*, at most ``slots`` extras at once. After each extra the idle
    measure restarts, so the next one is decided on a window that includes it.
    """

    def __init__(
        self,
        slots: int,
        *,
        wait_timeout_s: float = 900.0,
        fill_idle: IdleCpus | None = None,
        fill_idle_cores: float = 1.0,
    ) -> None:
        if slots < 1:
            raise ConfigError(f"a host capacity (commands at once) must be at least 1, got {slots}")
        if wait_timeout_s <= 0:
            raise ConfigError(f"the admission wait timeout must be positive, got {wait_timeout_s}")
        if not fill_idle_cores > 0:
            raise ConfigError(f"fill_idle_cores (idle cores for an extra) must be positive, got {fill_idle_cores}")
        self.slots = slots
        self.wait_timeout_s = wait_timeout_s
        self.fill_idle = fill_idle
        self.fill_idle_cores = fill_idle_cores
        self._line: deque[asyncio.Future[bool]] = deque()
        """Waiters in arrival order; each future's result says whether it runs as an extra."""
        self._regular = 0
        self._poller: asyncio.Task[None] | None = None
        self.running = 0
        self.extra_running = 0
        self.waiting = 0
        self.peak_running = 0
        self.peak_waiting = 0
        self.admitted = 0
        self.queued = 0
        """Commands that found every slot taken and waited."""
        self.extras = 0
        """Commands admitted beyond the slots onto idle cores."""
        self.wait_s = 0.0
        self.max_wait_s = 0.0

    def _first_waiter(self) -> asyncio.Future[bool] | None:
        while self._line and self._line[0].done():  # timed out or cancelled
            self._line.popleft()
        return self._line[0] if self._line else None

    def _grant(self) -> None:
        while self._regular < self.slots and (waiter := self._first_waiter()) is not None:
            self._line.popleft()
            self._regular += 1
            waiter.set_result(False)
        self._grant_extra()

    def _grant_extra(self) -> None:
        if self.fill_idle is None or self.extra_running >= self.slots:
            return
        waiter = self._first_waiter()
        if waiter is None or self.fill_idle.idle() < self.fill_idle_cores:
            return
        self._line.popleft()
        self.extra_running += 1
        self.extras += 1
        self.fill_idle.restart()
        waiter.set_result(True)

    async def _poll_idle(self, window_s: float) -> None:
        """While commands wait, look for idle cores once a window (nothing else would wake a waiter)."""
        try:
            while self._first_waiter() is not None:
                await asyncio.sleep(window_s)
                self._grant_extra()
        finally:
            self._poller = None

    async def _acquire(self) -> bool:
        """Wait for a slot; True if it was granted as an extra."""
        if self._regular < self.slots and self._first_waiter() is None:
            self._regular += 1
            return False
        ticket: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._line.append(ticket)
        if self.fill_idle is not None:
            self._grant_extra()
            if self._poller is None and not ticket.done():
                self._poller = asyncio.create_task(self._poll_idle(self.fill_idle.window_s))
        try:
            return await ticket
        except BaseException:
            if ticket.done() and not ticket.cancelled():
                self._release(ticket.result())  # granted just as the wait ended: hand it on
            else:
                ticket.cancel()
            raise

    def _release(self, extra: bool) -> None:
        if extra:
            self.extra_running -= 1
        else:
            self._regular -= 1
        self._grant()

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[float]:
        """Hold one slot for the block; yields the seconds waited for it."""
        start = time.monotonic()
        had_to_wait = self._regular >= self.slots or self._first_waiter() is not None
        self.waiting += 1
        self.peak_waiting = max(self.peak_waiting, self.waiting)
        try:
            async with asyncio.timeout(self.wait_timeout_s):
                extra = await self._acquire()
        except TimeoutError:
            raise CapacityExhaustedError(
                f"a command waited {self.wait_timeout_s:g} s for one of the host's {self.slots} command slots; "
                "admit fewer episodes at once or raise the host capacity"
            ) from None
        finally:
            self.waiting -= 1
        waited = time.monotonic() - start
        self.admitted += 1
        self.queued += int(had_to_wait)
        self.wait_s += waited
        self.max_wait_s = max(self.max_wait_s, waited)
        self.running += 1
        self.peak_running = max(self.peak_running, self.running)
        try:
            yield waited
        finally:
            self.running -= 1
            self._release(extra)

    def stats(self) -> dict[str, Any]:
        return {
            "slots": self.slots,
            "admitted": self.admitted,
            "queued": self.queued,
            "queued_fraction": round(self.queued / self.admitted, 4) if self.admitted else 0.0,
            "extras": self.extras,
            "wait_s_total": round(self.wait_s, 4),
            "wait_s_mean": round(self.wait_s / self.admitted, 4) if self.admitted else 0.0,
            "wait_s_max": round(self.max_wait_s, 4),
            "peak_running": self.peak_running,
            "peak_waiting": self.peak_waiting,
        }


class AdmittedSandbox(DelegatingSandbox[Sandbox]):
    """A sandbox whose commands each wait for a slot of a :class:`CommandAdmission`; files pass straight through."""

    def __init__(self, inner: Sandbox, admission: CommandAdmission) -> None:
        super().__init__(inner)
        self.admission = admission

    async def _run_exec(self, command: Command, run: Callable[[], Awaitable[ExecResult]]) -> ExecResult:
        async with self.admission.slot():
            return await run()

    def _snapshottable(self) -> Snapshottable:
        if not isinstance(self.inner, Snapshottable):
            raise SandboxError(f"sandbox {self.id} cannot be snapshotted or forked: its backend does not keep images")
        return self.inner

    async def snapshot(self, name: str | None = None) -> str:
        """The inner sandbox's snapshot (no command runs in the sandbox, so none is admitted)."""
        return await self._snapshottable().snapshot(name)

    async def fork(self, n: int) -> list[Sandbox]:
        """The inner sandbox's forks, their commands admitted through the same admission."""
        return [AdmittedSandbox(child, self.admission) for child in await self._snapshottable().fork(n)]

    async def forward_port(self, port: int, target: tuple[str, int]) -> ForwardedPort:
        """The inner sandbox's forward (relayed bytes are no command: none is admitted)."""
        return await forward_port(self.inner, port, target)


class AdmittedProvider:
    """Any provider, with every command of its sandboxes admitted through one :class:`CommandAdmission`."""

    def __init__(self, provider: SandboxProvider, admission: CommandAdmission) -> None:
        self.provider = provider
        self.admission = admission

    async def create(self, spec: SandboxSpec) -> AdmittedSandbox:
        return AdmittedSandbox(await self.provider.create(spec), self.admission)

    async def resolve_image(self, source: ImageSource) -> str:
        return await self.provider.resolve_image(source)

    @property
    def snapshots(self) -> bool:
        """Whether the wrapped provider's sandboxes can be snapshotted and forked."""
        return snapshots_of(self.provider)

    @property
    def port_forwarding(self) -> bool:
        """Whether the wrapped provider's sandboxes can be given a host port."""
        return isinstance(self.provider, PortForwardingProvider) and self.provider.port_forwarding

    async def remove_image(self, name: str) -> None:
        if not isinstance(self.provider, SnapshotProvider):
            raise ConfigError(f"this provider ({type(self.provider).__name__}) makes no snapshot images to remove")
        await self.provider.remove_image(name)
