"""The sandbox service's state: live sandboxes, their TTLs, admission control and draining.

:class:`SandboxService` sits between the HTTP routes (:mod:`sandrl.sandbox.service.server`) and any
:class:`~sandrl.sandbox.base.SandboxProvider`. It owns every sandbox it hands out:

- **TTL.** Each sandbox is killed ``ttl_s`` after creation (or after its last
  ``POST .../timeout``) by the service's own timer, whatever the client does; a backend that
  can also enforce the TTL itself (``set_ttl``: bwrap's agent exits at its deadline) is told
  too, so a sandbox outlives not even a crashed server.
- **Admission.** At ``max_live`` (live + being created), under the memory reserve, or under
  memory pressure, a create fails with ``capacity_exhausted``, or queues up to the
  ``wait_s`` the client asked for (clamped to ``max_create_wait_s``).
- **Drain.** :meth:`shutdown` refuses new creates, lets running execs finish up to
  ``drain_grace_s``, then closes every sandbox.

What a crashed predecessor left (cgroups, records) is reaped by the provider when it starts
(:meth:`sandrl.sandbox.bwrap.BwrapProvider.reap`); the count is exported as a metric.
Optional backend features (streaming exec, streamed files, TTL extension, close callbacks)
are used when the sandbox has them, and emulated or refused when it does not.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol, TypedDict, Unpack, runtime_checkable

from sandrl.errors import CapacityExhaustedError, InvalidSpecError, SandboxNotFoundError
from sandrl.host_memory import ADMISSION_MEMORY_AGE_S, mem_available_bytes
from sandrl.sandbox.base import (
    ExecCall,
    ExecResult,
    Pausable,
    Sandbox,
    SandboxProcess,
    SandboxProvider,
    SandboxSpec,
    Snapshottable,
)
from sandrl.sandbox.command import Command
from sandrl.sandbox.remote.wire import MIN_TTL_S
from sandrl.sandbox.service.errors import ServiceError
from sandrl.sandbox.service.metrics import ServiceMetrics, pressure_avg10

log = logging.getLogger("sandrl.service")


@dataclass(frozen=True)
class ServiceConfig:
    """Limits and timeouts of one sandbox service."""

    max_live: int | None = None
    """Most sandboxes alive (or being created) at once; None: bounded by the host only."""
    min_free_memory_mb: int = 512
    """Creates are refused while the host has less memory available than this."""
    max_memory_pressure: float = 40.0
    """Creates are refused while the host's memory PSI ``full avg10`` (percent) is above this."""
    max_ttl_s: float = 86400.0
    """The longest TTL a create or a timeout extension may ask for."""
    max_paused_s: float = 86400.0
    """A sandbox paused this long (its TTL stopped, its memory held) is closed."""
    max_create_wait_s: float = 300.0
    """The longest a create may queue for room (the client's ``wait_s`` is clamped to it)."""
    drain_grace_s: float = 30.0
    """On SIGTERM, how long running execs may take to finish before everything is closed."""
    exec_grace_s: float = 5.0
    """How long past an exec's own timeout the service waits before it answers exec_timeout."""
    max_json_bytes: int = 16 << 20
    """Largest JSON request body (exec stdin included); files and tars go through streamed routes."""
    max_file_bytes: int = 64 << 30
    """Largest file or tar upload (the sandbox's disk_mb bounds it too: see :meth:`SandboxService.upload_limit`),
    and largest file download (streamed window by window as the client reads, so it costs no memory;
    the bound stops an endless file such as a link to /dev/zero)."""
    keepalive_s: float = 15.0
    """A streaming exec sends a keep-alive comment after this long without output."""
    max_unread_bytes: int = 64 << 20
    """A call channel whose client leaves more bytes of answers than this unread (held in the server's
    memory) is dropped; no call starts on it while its client is not reading (:mod:`.channel`)."""

    def __post_init__(self) -> None:
        if self.max_live is not None and self.max_live < 1:
            raise InvalidSpecError("max_live must be at least 1")
        for name in ("max_ttl_s", "max_paused_s", "drain_grace_s", "exec_grace_s", "keepalive_s", "max_unread_bytes"):
            if not getattr(self, name) > 0:
                raise InvalidSpecError(f"{name} must be positive")


class SpawnOptions(TypedDict, total=False):
    """The options of :meth:`~sandrl.sandbox.bwrap.BwrapSandbox.spawn` (its defaults are there)."""

    timeout_s: float | None
    cwd: str | None
    env: Mapping[str, str] | None
    stdin: bool
    output_cap: int | None


@runtime_checkable
class StreamingSandbox(Protocol):
    """What :class:`~sandrl.sandbox.bwrap.BwrapSandbox` offers beyond :class:`Sandbox`: used when present."""

    async def spawn(self, command: Command, **options: Unpack[SpawnOptions]) -> SandboxProcess: ...

    async def write_file_stream(self, path: str, chunks: AsyncIterator[bytes], mode: int = 0o644) -> int: ...

    def read_file_stream(self, path: str, *, max_bytes: int = ...) -> AsyncIterator[bytes]: ...


@dataclass
class Entry:
    """One sandbox the service holds."""

    sandbox: Sandbox
    spec: SandboxSpec
    metadata: dict[str, str]
    created_at: float
    expires_at: float
    timer: asyncio.TimerHandle | None = None
    busy: int = 0
    why: str = ""
    """Why it is being closed: deleted, ttl, died, broken, shutdown."""
    closing: asyncio.Task[None] | None = field(default=None, repr=False)
    paused_ttl_s: float | None = None
    """While paused: the TTL it had left (its clock does not run)."""
    auto_pause: bool = False
    """At its TTL it is paused, not closed (E2B's ``autoPause``), once nothing runs in it."""
    timed_out: bool = False
    """Paused because its TTL ran out (``auto_pause``): it has no TTL left to go on with."""
    pausing: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def id(self) -> str:
        return self.sandbox.id


RECENT_CLOSED = 4096
AUTO_PAUSE_WAIT_S = 30.0
"""At its TTL, an ``auto_pause`` sandbox running a command (or a transfer) is paused once that has
finished, if within this long; else it is closed as any sandbox at its TTL (a freeze in the middle
of a command would leave its caller hanging)."""
AUTO_PAUSE_GRACE_S = AUTO_PAUSE_WAIT_S + 30.0
"""How much longer than the service's the TTL of an ``auto_pause`` sandbox's own backstop clock is
(the sandbox ends itself at it), so that the service can pause it first."""


class SandboxService:
    def __init__(self, provider: SandboxProvider, config: ServiceConfig | None = None) -> None:
        self.provider = provider
        self.config = config or ServiceConfig()
        self.entries: dict[str, Entry] = {}
        self.recent: OrderedDict[str, str] = OrderedDict()
        """Ids of sandboxes gone lately, with why, so a client is told more than 'not found'."""
        self.creating = 0
        self.running = 0
        """Execs (and file transfers) in flight."""
        self.draining = False
        self.loop: asyncio.AbstractEventLoop | None = None
        """The event loop serving this service (set when the app starts)."""
        self.metrics = ServiceMetrics(lambda: len(self.entries))
        self._room = asyncio.Event()
        self._idle = asyncio.Event()
        reaped = getattr(provider, "reaped", None)
        if isinstance(reaped, list) and reaped:
            self.metrics.reaped.inc(len(reaped))
            log.warning("reaped %d sandboxes left by a previous server: %s", len(reaped), " ".join(reaped))

    # -- lookup

    def get(self, sandbox_id: str) -> Entry:
        entry = self.entries.get(sandbox_id)
        if entry is not None:
            return entry
        why = self.recent.get(sandbox_id)
        if why is not None:
            raise SandboxNotFoundError(f"sandbox {sandbox_id} is gone ({why}): create a new one")
        raise SandboxNotFoundError(
            f"no sandbox {sandbox_id} on this server: it may have expired, been deleted, or live on another "
            "server (GET /v1/sandboxes lists the live ones)"
        )

    def list(self, metadata: Mapping[str, str] | None = None) -> list[Entry]:
        want = dict(metadata or {})
        return [e for e in self.entries.values() if all(e.metadata.get(k) == v for k, v in want.items())]

    # -- create

    async def create(
        self,
        spec: SandboxSpec,
        metadata: Mapping[str, str] | None = None,
        wait_s: float = 0,
        *,
        auto_pause: bool = False,
    ) -> Entry:
        """A new sandbox; with ``auto_pause`` it is paused at its TTL instead of closed (:attr:`Entry.auto_pause`)."""
        self._check_not_draining()
        if spec.ttl_s < MIN_TTL_S:
            raise InvalidSpecError(
                f"ttl_s={spec.ttl_s:g} is too short to start a sandbox: ask for at least {MIN_TTL_S:g} s"
            )
        if spec.ttl_s > self.config.max_ttl_s:
            raise InvalidSpecError(
                f"ttl_s={spec.ttl_s:g} is over this server's maximum of {self.config.max_ttl_s:g} s: ask for less "
                "and extend it later with POST /v1/sandboxes/{id}/timeout"
            )
        await self._admit(min(max(wait_s, 0.0), self.config.max_create_wait_s))
        self._check_not_draining()
        self.creating += 1
        started = time.perf_counter()
        own = replace(spec, ttl_s=spec.ttl_s + AUTO_PAUSE_GRACE_S) if auto_pause else spec
        try:
            sandbox = await self.provider.create(own)
            if auto_pause and not isinstance(sandbox, Pausable):
                await sandbox.close()
                raise ServiceError(
                    "this server's sandbox backend cannot pause sandboxes: create without auto-pause",
                    error_code="not_supported",
                    http_status=400,
                )
        finally:
            self.creating -= 1
            self._room.set()
        self.metrics.create_seconds.observe(time.perf_counter() - started)
        entry = self._register(sandbox, spec, metadata)
        entry.auto_pause = auto_pause
        return entry

    def _register(self, sandbox: Sandbox, spec: SandboxSpec, metadata: Mapping[str, str] | None) -> Entry:
        self.metrics.creates.inc()
        now = time.time()
        entry = Entry(sandbox, spec, dict(metadata or {}), now, now + spec.ttl_s)
        self.entries[sandbox.id] = entry
        entry.timer = asyncio.get_running_loop().call_later(spec.ttl_s, self._expire, entry)
        add_callback = getattr(sandbox, "add_close_callback", None)
        if callable(add_callback):
            add_callback(lambda _sb: self._gone(entry))
        return entry

    def _check_idle(self, entry: Entry, supported: bool, verb: str, done: str) -> None:
        """Refuse to ``verb`` a sandbox whose backend cannot, or in which something runs (a freeze or
        a snapshot in the middle of a command would catch it half done)."""
        if not supported:
            raise ServiceError(
                f"sandbox {entry.id} cannot be {done} on this server's backend",
                error_code="not_supported",
                http_status=400,
            )
        if entry.busy:
            raise ServiceError(
                f"sandbox {entry.id} is running a command or a transfer: {verb} it when that has finished",
                error_code="sandbox_busy",
                http_status=409,
            )

    def _snapshottable(self, entry: Entry) -> Snapshottable:
        sandbox = entry.sandbox
        self._check_idle(entry, isinstance(sandbox, Snapshottable), "snapshot", "snapshotted")
        assert isinstance(sandbox, Snapshottable)
        return sandbox

    async def snapshot(self, entry: Entry, name: str | None = None) -> str:
        """An image of the sandbox's files as they are now (any later create can start from it)."""
        return await self._snapshottable(entry).snapshot(name)

    async def fork(self, entry: Entry, count: int, ttl_s: float | None = None) -> builtins.list[Entry]:
        """``count`` new sandboxes from the sandbox's current files, with its limits and labels."""
        sandbox = self._snapshottable(entry)
        self._check_not_draining()
        limit = self.config.max_live
        if limit is not None and len(self.entries) + self.creating + count > limit:
            raise CapacityExhaustedError(
                f"a fork of {count} would take this server over its {self.config.max_live} live sandboxes"
            )
        self.creating += count
        try:
            children = await sandbox.fork(count)
        finally:
            self.creating -= count
            self._room.set()
        made = [self._register(child, replace(entry.spec, entrypoint=False), entry.metadata) for child in children]
        if ttl_s is not None:
            await asyncio.gather(*(self.extend(e, ttl_s) for e in made))
        return made

    def _check_not_draining(self) -> None:
        if self.draining:
            raise ServiceError(
                "this server is shutting down and takes no new sandboxes: retry on another server or once it restarts",
                error_code="service_draining",
                http_status=503,
            )

    def full(self) -> str | None:
        """Why a create would be refused now, or None if there is room."""
        cfg = self.config
        live = len(self.entries) + self.creating
        if cfg.max_live is not None and live >= cfg.max_live:
            return f"{live} sandboxes are live or starting, this server's limit (--max-live {cfg.max_live})"
        available = mem_available_bytes(max_age_s=ADMISSION_MEMORY_AGE_S)
        if available is not None and available < cfg.min_free_memory_mb << 20:
            reserve = cfg.min_free_memory_mb
            return f"the host has {available >> 20} MiB of memory available, under its {reserve} MiB reserve"
        pressure = pressure_avg10("memory", "full", max_age_s=ADMISSION_MEMORY_AGE_S)
        if pressure is not None and pressure > cfg.max_memory_pressure:
            return f"the host is under memory pressure ({pressure:.0f}% of the last 10 s stalled on memory)"
        return None

    async def _admit(self, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while (reason := self.full()) is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if wait_s > 0:
                    hint = f"waited {wait_s:g} s for room; close sandboxes or retry later"
                else:
                    hint = "close sandboxes, retry later, or create with wait_s > 0 to queue for room"
                raise CapacityExhaustedError(f"{reason}: {hint}")
            self._room.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._room.wait(), min(remaining, 0.5))  # re-polls memory too

    # -- lifetime

    async def extend(self, entry: Entry, ttl_s: float) -> None:
        """Let the sandbox live ``ttl_s`` more seconds from now (a paused one: from its resume)."""
        if ttl_s > self.config.max_ttl_s:
            raise InvalidSpecError(f"ttl_s={ttl_s:g} is over this server's maximum of {self.config.max_ttl_s:g} s")
        if entry.paused_ttl_s is not None:
            entry.paused_ttl_s = ttl_s
            entry.timed_out = False
            return
        await self._set_own_ttl(entry, ttl_s)
        if entry.timer is not None:
            entry.timer.cancel()
        entry.timer = asyncio.get_running_loop().call_later(ttl_s, self._expire, entry)
        entry.expires_at = time.time() + ttl_s

    async def pause(self, entry: Entry) -> bool:
        """Freeze the sandbox and stop its TTL; False if it was paused already."""
        if entry.paused_ttl_s is not None:
            return False
        sandbox = entry.sandbox
        self._check_idle(entry, isinstance(sandbox, Pausable), "pause", "paused")
        assert isinstance(sandbox, Pausable)
        await sandbox.pause()
        if entry.timer is not None:
            entry.timer.cancel()
        entry.paused_ttl_s = max(entry.expires_at - time.time(), 1.0)
        # Paused, it holds its memory but has no TTL running: this bounds how long.
        entry.timer = asyncio.get_running_loop().call_later(
            self.config.max_paused_s, self._start_close, entry, "paused"
        )
        return True

    async def _set_own_ttl(self, entry: Entry, ttl_s: float) -> None:
        """Tell a backend that keeps its own clock (bwrap's pid 1 ends the sandbox at it) the new TTL;
        an ``auto_pause`` sandbox's runs :data:`AUTO_PAUSE_GRACE_S` behind the service's."""
        set_ttl = getattr(entry.sandbox, "set_ttl", None)
        if callable(set_ttl):
            await set_ttl(ttl_s + (AUTO_PAUSE_GRACE_S if entry.auto_pause else 0.0))

    async def resume(self, entry: Entry, *, after_timeout_s: float | None = None) -> None:
        """Thaw a paused sandbox; its TTL goes on from where it stopped. Nothing for a running one.

        A sandbox paused at its TTL (``auto_pause``) has none left: it goes on with ``after_timeout_s``
        (the caller's; E2B's API gives 15 s)."""
        if entry.paused_ttl_s is None or not isinstance(entry.sandbox, Pausable):
            return
        remaining, entry.paused_ttl_s = entry.paused_ttl_s, None
        if entry.timer is not None:
            entry.timer.cancel()
        if entry.timed_out and after_timeout_s is not None:
            remaining = after_timeout_s
        entry.timed_out = False
        await entry.sandbox.resume()
        if entry.auto_pause:
            await self._set_own_ttl(entry, remaining)  # its own clock kept the grace it had left, not this TTL's
        entry.timer = asyncio.get_running_loop().call_later(remaining, self._expire, entry)
        entry.expires_at = time.time() + remaining

    def _expire(self, entry: Entry) -> None:
        if entry.auto_pause and entry.closing is None:
            if entry.pausing is None or entry.pausing.done():
                entry.pausing = asyncio.get_running_loop().create_task(
                    self._auto_pause(entry), name=f"sandrl-svc-autopause-{entry.id}"
                )
            return
        self._start_close(entry, "ttl")

    async def _auto_pause(self, entry: Entry) -> None:
        """Pause ``entry`` at its TTL once nothing runs in it (see :data:`AUTO_PAUSE_WAIT_S`)."""
        deadline = time.monotonic() + AUTO_PAUSE_WAIT_S
        while entry.busy and entry.closing is None and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        if entry.closing is not None or entry.paused_ttl_s is not None:
            return
        if entry.busy:
            log.warning(
                "sandbox %s still ran a command %g s past its TTL: closed, not paused", entry.id, AUTO_PAUSE_WAIT_S
            )
            self._start_close(entry, "ttl")
            return
        try:
            await self.pause(entry)
        except Exception as exc:
            log.warning("sandbox %s could not be paused at its TTL and is closed: %s", entry.id, exc)
            self._start_close(entry, "ttl")
            return
        entry.timed_out = True

    def _start_close(self, entry: Entry, why: str) -> asyncio.Task[None]:
        if entry.closing is None:
            entry.why = entry.why or why
            entry.closing = asyncio.get_running_loop().create_task(
                self._close(entry), name=f"sandrl-svc-close-{entry.id}"
            )
        return entry.closing

    async def _close(self, entry: Entry) -> None:
        try:
            await entry.sandbox.close()
        except Exception:
            log.exception("closing sandbox %s failed", entry.id)
        self._gone(entry)

    async def delete(self, entry: Entry) -> None:
        await asyncio.shield(self._start_close(entry, "deleted"))

    def _gone(self, entry: Entry) -> None:
        if self.entries.get(entry.id) is not entry:
            return
        del self.entries[entry.id]
        if entry.timer is not None:
            entry.timer.cancel()
        why = entry.why or ("ttl" if "TTL" in str(getattr(entry.sandbox, "close_reason", "")) else "died")
        self.recent[entry.id] = {
            "deleted": "deleted by a client",
            "ttl": f"its TTL expired at {time.strftime('%H:%M:%S', time.localtime(entry.expires_at))}; "
            "extend it with POST /v1/sandboxes/{id}/timeout next time",
            "died": "its processes died: " + (str(getattr(entry.sandbox, "close_reason", "")) or "unknown cause"),
            "broken": "it stopped answering and was closed",
            "shutdown": "the server shut down",
            "paused": f"it stayed paused for {self.config.max_paused_s:g} s, this server's limit (max_paused_s)",
        }.get(why, why)
        while len(self.recent) > RECENT_CLOSED:
            self.recent.popitem(last=False)
        self.metrics.closes.labels(why).inc()
        self._room.set()

    # -- work in a sandbox

    @contextlib.contextmanager
    def busy(self, entry: Entry) -> Iterator[None]:
        entry.busy += 1
        self.running += 1
        self._idle.clear()
        try:
            yield
        finally:
            entry.busy -= 1
            self.running -= 1
            if self.running == 0:
                self._idle.set()

    async def exec(self, entry: Entry, call: ExecCall) -> ExecResult:
        started = time.perf_counter()
        with self.busy(entry):
            result = await self.within_grace(entry, call.run_in(entry.sandbox), call.timeout_s)
        self.metrics.exec_seconds.observe(time.perf_counter() - started)
        return result

    async def file_stream(self, entry: Entry, sandbox: StreamingSandbox, path: str) -> AsyncIterator[bytes]:
        """The file at ``path`` as an answer streams it: its first chunk read now (a missing file fails
        here, before the answer starts), the rest as it is sent, ``entry`` busy meanwhile."""
        stream = sandbox.read_file_stream(path, max_bytes=self.config.max_file_bytes)
        first = await anext(stream, b"")

        async def body() -> AsyncIterator[bytes]:
            with self.busy(entry):
                if first:
                    yield first
                async for chunk in stream:
                    yield chunk

        return body()

    async def within_grace(self, entry: Entry, work: Awaitable[ExecResult], timeout_s: float) -> ExecResult:
        """``work``, or exec_timeout (and the sandbox closed) if it overruns its timeout by the grace period."""
        try:
            # A timeout scope, not wait_for: the same cancellation of ``work`` at the deadline without a
            # task of its own for every command (3.11's wait_for makes one).
            async with asyncio.timeout(timeout_s + self.config.exec_grace_s):
                return await work
        except TimeoutError:
            await asyncio.shield(self._start_close(entry, "broken"))
            raise ServiceError(
                f"sandbox {entry.id} did not end a command {self.config.exec_grace_s:g} s after its timeout of "
                f"{timeout_s:g} s and was closed: create a new sandbox",
                error_code="exec_timeout",
                http_status=504,
            ) from None

    def streaming(self, entry: Entry) -> StreamingSandbox | None:
        sandbox = entry.sandbox
        return sandbox if isinstance(sandbox, StreamingSandbox) else None

    def upload_limit(self, entry: Entry) -> int:
        """The most bytes one upload into ``entry`` may carry: its writable disk, or the server's cap if lower.

        An upload that could not fit is refused before its bytes reach the host (from its
        declared length) or cut as soon as it passes this (streamed, or inflated from gzip).
        """
        return min(self.config.max_file_bytes, entry.spec.disk_mb << 20)

    def too_big(self, entry: Entry, what: str = "the upload") -> ServiceError:
        limit = self.upload_limit(entry)
        if limit < self.config.max_file_bytes:
            where = f"the writable disk of sandbox {entry.id} (disk_mb={entry.spec.disk_mb})"
            hint = "create the sandbox with a larger disk_mb, or send less"
        else:
            where = "this server's upload limit"
            hint = "send it in parts, or raise the server's max_file_bytes"
        return ServiceError(
            f"{what} is over {limit} bytes, {where}: {hint}", error_code="payload_too_large", http_status=413
        )

    # -- shutdown

    async def shutdown(self, grace_s: float | None = None) -> None:
        """Refuse new creates, let running work finish up to ``grace_s``, then close every sandbox."""
        self.draining = True
        grace = self.config.drain_grace_s if grace_s is None else grace_s
        if self.running:
            log.warning("draining: waiting up to %g s for %d running execs", grace, self.running)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), grace)
        entries = list(self.entries.values())
        await asyncio.gather(*(self._start_close(e, "shutdown") for e in entries), return_exceptions=True)


class BoundedBody:
    """An upload's chunks, ended (not failed) once they pass ``limit`` bytes: ``over`` then says so.

    Ending the stream rather than raising in the middle of it lets the writer close its file in
    the sandbox as after any upload; the route then answers that the upload was too big.
    """

    def __init__(self, chunks: AsyncIterator[bytes], limit: int) -> None:
        self._chunks = chunks
        self.limit = limit
        self.seen = 0
        self.over = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._chunks:
            self.seen += len(chunk)
            if self.seen > self.limit:
                self.over = True
                return
            if chunk:
                yield chunk
