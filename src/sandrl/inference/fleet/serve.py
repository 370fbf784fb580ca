"""A fleet in one call: the engines (launched here, or started elsewhere) behind one router URL.

:func:`open_fleet` yields a :class:`Fleet` whose ``url`` and ``token`` a client takes as one
server's (:func:`sandrl.wiring.open_policy` makes the run's policy from them):

- ``[inference] launch = ...``: the engines of :mod:`~sandrl.inference.fleet.commands` are started
  (:mod:`~sandrl.inference.fleet.launch`) on this host's free ports (or ``port`` and the ones after
  it, refused if one is taken), with one fresh token for them and the router.
- ``attach`` URLs (``--inference URL,URL``): each must answer ``/health`` now (a ConfigError names
  the one that does not); they keep the token their client was given.

Either way the router (:mod:`~sandrl.inference.fleet.proxy`) is served on this event loop on a
loopback port (or on ``host``: the driver of a Ray cluster of several nodes, :mod:`sandrl.cluster.engines`),
and everything stops when the context ends.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from sandrl.background_server import serve_on_loop
from sandrl.errors import ConfigError
from sandrl.http_auth import is_loopback, new_token
from sandrl.inference.fleet.commands import HOST, check_installed, engine_command, partition_devices, visible_devices
from sandrl.inference.fleet.config import FleetConfig
from sandrl.inference.fleet.launch import Launcher
from sandrl.inference.fleet.proxy import FleetProxy
from sandrl.inference.fleet.router import Router


@dataclass(frozen=True)
class Fleet:
    """The engines behind one router: what a client needs (``url``, ``token``) and what tests and benches read."""

    url: str
    """The router's URL: a client speaks to it as to one engine."""
    token: str | None
    """Sent as ``Authorization: Bearer``: the router's, which is the engines' own."""
    router: Router
    proxy: FleetProxy
    launcher: Launcher | None
    """The engine processes, when this fleet started them."""

    @property
    def engine_urls(self) -> list[str]:
        return [e.url for e in self.router.engines]

    # -- what a weight broadcast needs from the fleet (:class:`~sandrl.inference.broadcast_policy.BroadcastTargets`)

    def group_members(self) -> tuple[str, ...]:
        return self.router.group_members()

    def group_epoch(self) -> int:
        return self.router.losses

    def weights_broadcast(self, version: int) -> None:
        self.proxy.replay.broadcasted(version)


@contextlib.asynccontextmanager
async def open_fleet(
    config: FleetConfig,
    *,
    model: str,
    log_dir: Path,
    seed: int = 0,
    update_policy: str = "pause",
    attach: Sequence[str] = (),
    token: str | None = None,
    visible: Sequence[str] | None = None,
    host: str = HOST,
) -> AsyncIterator[Fleet]:
    """The fleet of ``config`` (or of the ``attach`` URLs), served behind a router until the context ends.

    ``log_dir`` gets each launched engine's log (``engine-N.log``); ``visible``: this host's GPUs
    (default: ``CUDA_VISIBLE_DEVICES``, else CUDA's count); ``host``: the router's address (loopback but for
    the rollout workers of a Ray cluster on several nodes, :mod:`sandrl.cluster.engines`: a token is then needed)."""
    launcher: Launcher | None = None
    if config.launched:
        if attach:
            raise ConfigError(
                "[inference] launch starts engines and [model] inference names engines started elsewhere: "
                "give one of them (drop [inference] launch, or set [model] inference = 'embedded')"
            )
        check_installed(config.launch)
        devices = partition_devices(config, visible_devices() if visible is None else visible)
        token = new_token()
        commands = [
            engine_command(
                config,
                i,
                model=model,
                port=port,
                token=token,
                devices=devices[i],
                seed=seed,
                update_policy=update_policy,
            )
            for i, port in enumerate(engine_ports(config))
        ]
        launcher = Launcher(
            commands, log_dir, startup_timeout_s=config.startup_timeout_s, max_restarts=config.max_restarts
        )
        await launcher.start()
        urls = [c.url for c in commands]
    else:
        if not attach:
            raise ConfigError("a fleet needs [inference] launch, or the URLs of engines started elsewhere")
        await check_reachable(attach)
        urls = list(attach)
    router = Router(urls)
    proxy = FleetProxy(router, token=token, wait_s=config.startup_timeout_s, remote=not is_loopback(host))
    if launcher is not None:
        launcher.on_lost = lambda i, why: proxy.lost(router.engines[i], why)
        launcher.on_gone = lambda i: setattr(router.engines[i], "gone", True)
    try:
        async with serve_on_loop(proxy, host, name="inference router") as url:
            proxy.start()
            yield Fleet(url, token, router, proxy, launcher)
    finally:
        await proxy.aclose()
        if launcher is not None:
            launcher.stop()


def engine_ports(config: FleetConfig) -> list[int]:
    """The engines' ports: ``port`` and the ones after it, each checked free; or free ones of this host."""
    if config.port:
        ports = list(range(config.port, config.port + config.engines))
        for i, port in enumerate(ports):
            with socket.socket() as s:
                try:
                    s.bind((HOST, port))
                except OSError as exc:
                    raise ConfigError(
                        f"port {port} (inference engine {i}) is in use on {HOST} ({exc.strerror}): stop what holds it, "
                        "or set [inference] port to another first port (0: sandrl picks free ones)"
                    ) from exc
        return ports
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(config.engines)]
        for s in sockets:
            s.bind((HOST, 0))
        return [s.getsockname()[1] for s in sockets]


async def check_reachable(urls: Sequence[str], timeout_s: float = 5.0) -> None:
    """Each URL answers ``/health``; a ConfigError naming the first that does not, and what to do."""
    async with httpx.AsyncClient(timeout=timeout_s) as http:
        for i, url in enumerate(urls):
            try:
                answer = await http.get(url.rstrip("/") + "/health")
            except httpx.HTTPError as exc:
                problem = f"is not reachable ({type(exc).__name__}: {exc or 'no answer'})"
            else:
                if answer.status_code == 200:
                    continue
                problem = f"answered /health with {answer.status_code}"
            raise ConfigError(
                f"inference engine {url} (number {i + 1} of {len(urls)} in [model] inference / --inference) {problem}: "
                "start it, or drop it from the list"
            )
