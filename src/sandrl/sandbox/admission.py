"""Command admission over any sandbox provider: at most so many commands run on a host at once.

:class:`CommandAdmission` bounds what a host's CPUs are asked to do at once: at most ``slots``
commands run across the sandboxes of an :class:`AdmittedProvider` (which wraps any provider),
the rest wait in FIFO order. A host's capacity within a latency bar is a
number of *busy* sandboxes (``sandrl bench contention``), and an episode is busy only while a
command runs, not while its agent waits on the model: so admission holds commands, not
sandboxes. The rollout runner takes it as ``RunnerConfig.host_capacity``. With ``fill_idle``
it is work-conserving: a waiting command also runs when cores sit idle (:mod:`sandrl.sandbox.idle_cpu`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from sandrl.errors import CapacityExhaustedError, ConfigError, SandboxError
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
from sandrl.sandbox.command import Command
from sandrl.sandbox.delegating import DelegatingSandbox
from sandrl.sandbox.idle_cpu import IdleCpus


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
