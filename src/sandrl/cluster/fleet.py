"""FleetProvider: one :class:`~sandrl.sandbox.base.SandboxProvider` over many sandbox hosts.

::

    hosts = [HostConfig("http://10.0.0.2:8700", capacity=16), HostConfig("http://10.0.0.3:8700", capacity_file="b")]
    async with FleetProvider(hosts) as fleet:                 # starts the health checks
        async with await fleet.create(SandboxSpec()) as sb:   # on the host with the most free capacity
            await sb.exec("make test")
        print(fleet.metrics())                                 # per host: placements, failures, live, p95s

**Placement.** A host's *load* is its live sandboxes plus the commands running in them (live
counts this provider's own sandboxes plus those of other clients the host reported at its last
health check). Each create goes to the healthy host with the most free capacity
(``capacity - load``, the bigger host on a tie); once every host is at or past its capacity, to
the one with the lowest share (``load / capacity``), so an overloaded fleet stays loaded in
proportion to what each host can take. A host
refusing a create (full: ``capacity_exhausted``; unreachable) is skipped for that create and the
next one tried; only when every healthy host refused does the create fail.

**Health.** Every ``health_interval_s`` each host's ``/healthz`` is polled. A host that fails a
check, or whose connection breaks under a call, is taken out of placement at once; after
``recover_after`` passing checks in a row it is put back.

**Losing a host.** A call that fails because its host went away raises
:class:`~sandrl.errors.SandboxHostLostError` naming the host and the cause: the episode ends as a
retryable ``infra_error`` and its retry is placed on another host. A sandbox's id is
``<host name>/<id on the host>``, so every trajectory says which host it ran on.

Sandboxes carry the provider's ``labels`` as metadata; :meth:`FleetProvider.reap` closes every
sandbox with those labels (what a crashed predecessor with the same labels left behind).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar

import httpx

from sandrl.cluster.hosts import Baselines, HostConfig, HostStats
from sandrl.errors import (
    CapacityExhaustedError,
    ConfigError,
    SandboxError,
    SandboxHostLostError,
    SandboxUnavailableError,
)
from sandrl.sandbox.base import ExecResult, ImageSource, SandboxSpec, prebuilt_image
from sandrl.sandbox.command import Command, describe
from sandrl.sandbox.delegating import DelegatingSandbox
from sandrl.sandbox.remote.config import ClientConfig
from sandrl.sandbox.remote.provider import RemoteProvider, RemoteSandbox

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class FleetConfig:
    """Health checking and the HTTP client of each host."""

    health_interval_s: float = 5.0
    """Seconds between health checks of each host."""
    health_timeout_s: float = 2.0
    """A check that takes longer fails."""
    recover_after: int = 1
    """Passing checks in a row before a failed host takes sandboxes again."""
    client: ClientConfig = field(default_factory=lambda: ClientConfig(retries=2, backoff_s=0.1))
    """Timeouts and retries of the calls to each host (see :class:`~sandrl.sandbox.remote.config.ClientConfig`)."""

    def __post_init__(self) -> None:
        if self.health_interval_s <= 0 or self.health_timeout_s <= 0:
            raise ConfigError("health_interval_s and health_timeout_s must be positive")
        if self.recover_after < 1:
            raise ConfigError(f"recover_after must be >= 1, got {self.recover_after}")


class Host:
    """One host's client, health and counters."""

    def __init__(self, config: HostConfig, fleet: FleetConfig, labels: Mapping[str, str]) -> None:
        self.config = config.resolved()
        self.name = self.config.name
        assert self.config.capacity is not None
        self.capacity: float = self.config.capacity
        token = self.config.load_token()
        self.provider = RemoteProvider(self.config.url, token=token, config=fleet.client, metadata=labels)
        probe = ClientConfig(
            timeout_s=fleet.health_timeout_s, connect_timeout_s=fleet.health_timeout_s, retries=0, backoff_s=0
        )
        self.probe = RemoteProvider(self.config.url, token=token, config=probe)
        self.healthy = True
        self.passes = 0
        self.others_live = 0
        """Sandboxes of other clients on the host, from its last health check."""
        self.last_error: str | None = None
        self.stats = HostStats()

    @property
    def load(self) -> float:
        return float(self.stats.live + self.others_live + self.stats.running)

    @property
    def free(self) -> float:
        return self.capacity - self.load

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.config.url,
            "capacity": self.capacity,
            "healthy": self.healthy,
            "others_live": self.others_live,
            "last_error": self.last_error,
            **self.stats.to_dict(),
        }


def _is_host_failure(exc: BaseException) -> bool:
    """The host itself failed (unreachable, connection broke), as opposed to an error answer."""
    if isinstance(exc, SandboxUnavailableError):
        return exc.error_code in ("service_unreachable", "service_connection_lost", "service_draining")
    return isinstance(exc, httpx.TransportError | OSError)


class FleetProvider:
    """A sandbox provider over many ``sandrl serve sandboxes`` hosts; see the module docstring."""

    def __init__(
        self,
        hosts: Sequence[HostConfig],
        config: FleetConfig | None = None,
        *,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        if not hosts:
            raise ConfigError("a fleet needs at least one sandbox host ([[cluster.hosts]] url = ...)")
        names = [h.name for h in hosts]
        if len(set(names)) != len(names):
            raise ConfigError(f"sandbox host names must differ, got {', '.join(names)}")
        self.config = config or FleetConfig()
        self.labels = dict(labels or {})
        self.hosts = [Host(h, self.config, self.labels) for h in hosts]
        self.baselines = Baselines()
        self._health: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Future[None]] = set()
        """Closes of sandboxes whose create was cancelled while in flight."""
        self._closed = False

    # -- placement

    def candidates(self) -> list[Host]:
        """Healthy hosts in placement order (see the module docstring)."""
        healthy = [h for h in self.hosts if h.healthy]
        if any(h.free > 0 for h in healthy):
            return sorted(healthy, key=lambda h: (-h.free, -h.capacity))
        return sorted(healthy, key=lambda h: (h.load / h.capacity, -h.capacity))

    async def create(self, spec: SandboxSpec) -> FleetSandbox:
        self._start_health()
        tried: list[str] = []
        for host in self.candidates():
            host.stats.live += 1  # reserved while the create is in flight, so concurrent creates spread
            creating = asyncio.ensure_future(host.provider.create(spec))
            try:
                inner = await asyncio.shield(creating)
            except CapacityExhaustedError as exc:
                host.stats.live -= 1
                tried.append(f"{host.name}: full ({exc.message})")
                continue
            except asyncio.CancelledError:
                # The host makes the sandbox anyway: close it once it exists, or it lives until its TTL.
                host.stats.live -= 1
                closing = asyncio.ensure_future(self._close_when_made(creating))
                self._closing.add(closing)
                closing.add_done_callback(self._closing.discard)
                raise
            except BaseException as exc:
                host.stats.live -= 1
                if not _is_host_failure(exc):
                    host.stats.failures += 1
                    raise
                self._host_failed(host, exc)
                tried.append(f"{host.name}: {exc}")
                continue
            host.stats.placements += 1
            return FleetSandbox(self, host, inner)
        down = [h.name for h in self.hosts if not h.healthy]
        detail = "; ".join(tried) if tried else "no host was tried"
        raise SandboxHostLostError(
            f"no sandbox host could take the sandbox ({detail}); hosts out of placement: {', '.join(down) or 'none'}. "
            "Check the hosts (`sandrl sandbox ls --server URL`); a failed host is put back once its /healthz passes"
        )

    async def resolve_image(self, source: ImageSource) -> str:
        """Hosts build nothing for a client: ``source``'s prebuilt image, or ``host``."""
        return prebuilt_image(source)

    @staticmethod
    async def _close_when_made(creating: asyncio.Future[RemoteSandbox]) -> None:
        try:
            sandbox = await creating
            await sandbox.close()
        except Exception as exc:
            log.debug("an abandoned create left nothing to close (%s)", exc)

    # -- health

    def _host_failed(self, host: Host, exc: BaseException) -> None:
        host.stats.failures += 1
        host.last_error = f"{type(exc).__name__}: {exc}"
        host.passes = 0
        if host.healthy:
            host.healthy = False
            host.stats.down_events += 1
            log.warning("sandbox host %s (%s) taken out of placement: %s", host.name, host.config.url, exc)

    def _start_health(self) -> None:
        if self._health is None and not self._closed:
            self._health = asyncio.ensure_future(self._health_loop())

    async def _health_loop(self) -> None:
        while True:
            await asyncio.gather(*(self.check(h) for h in self.hosts))
            await asyncio.sleep(self.config.health_interval_s)

    async def check(self, host: Host) -> bool:
        """One health check of ``host``; updates whether it takes sandboxes."""
        try:
            health = await host.probe.health()
            if health.status != "ok":
                raise SandboxUnavailableError(f"{host.name} reports {health.status}", error_code="service_draining")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            host.passes = 0
            host.last_error = f"health check: {type(exc).__name__}: {exc}"
            if host.healthy:
                host.healthy = False
                host.stats.down_events += 1
                log.warning("sandbox host %s (%s) failed its health check: %s", host.name, host.config.url, exc)
            return False
        host.others_live = max(0, health.live - host.stats.live)
        host.passes += 1
        if not host.healthy and host.passes >= self.config.recover_after:
            host.healthy = True
            log.info("sandbox host %s (%s) is back in placement", host.name, host.config.url)
        return True

    async def check_all(self) -> dict[str, bool]:
        """Check every host now; which are healthy."""
        results = await asyncio.gather(*(self.check(h) for h in self.hosts))
        return {h.name: ok for h, ok in zip(self.hosts, results, strict=True)}

    # -- lifecycle and metrics

    async def reap(self) -> int:
        """Close every sandbox carrying this provider's labels on every reachable host; how many."""
        if not self.labels:
            return 0
        closed = 0
        for host in self.hosts:
            try:
                leftovers = await host.provider.list_sandboxes(self.labels)
                for info in leftovers:
                    closed += await host.provider.kill(info.id)
            except SandboxError as exc:
                log.warning("could not reap %s's leftovers on %s: %s", self.labels, host.name, exc)
        return closed

    def metrics(self) -> dict[str, dict[str, Any]]:
        """Per host: url, capacity, healthy, placements, failures, live, running, command p50/p95, slowdown p95."""
        return {h.name: h.to_dict() for h in self.hosts}

    async def aclose(self) -> None:
        self._closed = True
        if self._health is not None:
            self._health.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
        for host in self.hosts:
            await host.provider.aclose()
            await host.probe.aclose()

    async def __aenter__(self) -> FleetProvider:
        self._start_health()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


class FleetSandbox(DelegatingSandbox[RemoteSandbox]):
    """A sandbox on one host of a fleet (a :class:`~sandrl.sandbox.base.Sandbox`); counts its host's load."""

    def __init__(self, fleet: FleetProvider, host: Host, inner: RemoteSandbox) -> None:
        super().__init__(inner)
        self.fleet = fleet
        self.host = host
        self.id = f"{host.name}/{inner.id}"
        self.closed = False

    def _lost(self, exc: BaseException, what: str) -> BaseException:
        if not _is_host_failure(exc):
            return exc
        self.fleet._host_failed(self.host, exc)
        return SandboxHostLostError(
            f"sandbox host {self.host.name} ({self.host.config.url}) was lost during {what} in sandbox {self.id}: "
            f"{exc}; the episode can be retried on another host"
        )

    async def _run_exec(self, command: Command, run: Callable[[], Awaitable[ExecResult]]) -> ExecResult:
        stats = self.host.stats
        stats.running += 1
        started = time.monotonic()
        try:
            result = await run()
        except Exception as exc:
            raise self._lost(exc, "exec") from exc
        finally:
            stats.running -= 1
        stats.commands += 1
        stats.latencies.append(time.monotonic() - started)
        if not result.timed_out:
            slowdown = self.fleet.baselines.slowdown(describe(command), result.duration_s)
            if slowdown is not None:
                stats.slowdowns.append(slowdown)
        return result

    async def _run_file(self, what: str, run: Callable[[], Awaitable[T]]) -> T:
        try:
            return await run()
        except Exception as exc:
            raise self._lost(exc, what) from exc

    async def close(self) -> None:
        """Close it on its host; idempotent. A sandbox on a host that died is gone with it (or reaped on restart)."""
        if self.closed:
            return
        self.closed = True
        self.host.stats.live -= 1
        try:
            await self.inner.close()
        except Exception as exc:
            if not _is_host_failure(exc):
                raise
            self.fleet._host_failed(self.host, exc)
            log.info("sandbox %s went with its host %s: %s", self.id, self.host.name, exc)
