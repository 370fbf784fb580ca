"""``[inference] launch`` under ``--ray``: one Ray actor per engine, in one placement group, behind the driver's router.

::

    driver (sandrl train --ray)                        Ray actors (placement group, one bundle each)
      router (sandrl.inference.fleet.proxy)  ──►  EngineActor x engines: a Launcher of one engine
        ▲ every episode pinned to one engine            (its guard, its restarts, its log)
      RolloutWorker x N sample through the router's URL

- **Placement.** ``engines`` bundles of ``[cluster] engine_cpus`` CPUs and ``gpus_per_engine`` GPUs
  (none for ``launch = "embedded"``), packed on as few nodes as fit. A group the cluster cannot hold
  (more GPUs or CPUs than it has) is refused at once, in one line; one that does not become ready
  within ``[cluster] worker_wait_s`` (the resources are taken by others) is too.
- **Each actor** runs the command :func:`~sandrl.inference.fleet.commands.engine_command` builds, under
  a :class:`~sandrl.inference.fleet.launch.Launcher` of its own: the engine gets the GPUs Ray gave the
  actor, restarts when it dies (``max_restarts``, with backoff), and its guard stops it when the actor
  ends (``ray.kill`` or a crash: the guard's parent is the actor's process). Its log is
  ``<output_dir>/engines/engine-N.log`` on the actor's node.
- **Addresses.** An engine on the driver's machine binds loopback; one on another node binds that
  node's address (what ``ray.util.get_node_ip_address`` says there), so the driver's router reaches it.
  The router binds loopback when every node of the cluster is this machine, else the driver's
  address. The engines and the router share one fresh token (the rollout workers get it with their
  spec); off loopback it is the only credential.
- ``[cluster] inference`` (or ``[model] inference``) URLs, engines started elsewhere, go behind the same
  router instead, with ``[model] token_file``'s token.

The actors and their engines are stopped when the run ends or fails (:meth:`EngineGroup.kill`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import ray

from sandrl.cluster.config import ClusterConfig, ClusterOptions
from sandrl.cluster.ray import NAMESPACE
from sandrl.errors import ClusterError, ConfigError, SandrlError
from sandrl.http_auth import new_token
from sandrl.inference.fleet.commands import HOST, check_installed, engine_command
from sandrl.inference.fleet.config import FleetConfig
from sandrl.inference.fleet.launch import Launcher
from sandrl.inference.fleet.serve import Fleet, open_fleet
from sandrl.train.run_config import RunConfig


def engine_actor_name(run_id: str, index: int) -> str:
    """The Ray actor name of engine ``index`` of a run (namespace ``sandrl``)."""
    return f"sandrl-{run_id}-engine-{index}"


def node_ip() -> str:
    address: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
    return address


class EngineActor:
    """The body of one engine's actor: a :class:`Launcher` of that one engine (see the module docstring)."""

    def __init__(
        self, config: FleetConfig, index: int, model: str, token: str, seed: int, update_policy: str, log_dir: str
    ) -> None:
        self.config, self.index, self.model, self.token = config, index, model, token
        self.seed, self.update_policy, self.log_dir = seed, update_policy, Path(log_dir)
        self.launcher: Launcher | None = None

    async def start(self, driver_ip: str) -> str:
        """Start the engine, wait until it answers; its URL."""
        check_installed(self.config.launch)
        host = HOST if node_ip() == driver_ip else node_ip()
        port = self.config.port + self.index if self.config.port else _free_port(host)
        devices = tuple(str(g) for g in ray.get_gpu_ids())[: self.config.gpus] if self.config.gpus else ()
        command = engine_command(
            self.config,
            self.index,
            model=self.model,
            port=port,
            token=self.token,
            devices=devices,
            seed=self.seed,
            update_policy=self.update_policy,
            host=host,
        )
        self.launcher = Launcher(
            [command],
            self.log_dir,
            startup_timeout_s=self.config.startup_timeout_s,
            max_restarts=self.config.max_restarts,
        )
        await self.launcher.start()
        return command.url

    async def stop(self) -> None:
        if self.launcher is not None:
            self.launcher.stop()


def _free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


class EngineGroup:
    """The driver's view of the engine actors: started in :meth:`start`, ended by :meth:`kill`."""

    def __init__(self, run: RunConfig, options: ClusterOptions, run_id: str) -> None:
        self.run, self.options, self.run_id = run, options, run_id
        self.config = run.inference
        self.token = new_token()
        self.handles: list[Any] = []
        self.group: Any = None

    def bundle(self) -> dict[str, float]:
        gpus = self.config.gpus
        return {"CPU": self.options.engine_cpus, **({"GPU": float(gpus)} if gpus else {})}

    def check_room(self) -> None:
        """Refuse, in one line, a group larger than the whole cluster."""
        total = ray.cluster_resources()  # type: ignore[no-untyped-call]
        n = self.config.engines
        for resource, per in self.bundle().items():
            need, have = per * n, float(total.get(resource, 0.0))
            if need > have:
                knob = "gpus_per_engine" if resource == "GPU" else "[cluster] engine_cpus"
                raise ClusterError(
                    f"[inference] engines = {n} x {per:g} {resource}s each ({knob}) needs {need:g} {resource}s and "
                    f"the Ray cluster has {have:g}: lower engines or {knob}, or add nodes (see `ray status`)"
                )

    async def start(self) -> list[str]:
        """Place the actors, start every engine; their URLs. On a failure everything started is ended."""
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.check_room()
        n, wait_s = self.config.engines, self.options.worker_wait_s
        try:
            self.group = placement_group([self.bundle()] * n, strategy="PACK")
            try:
                await _within(self.group.ready(), wait_s)
            except TimeoutError as exc:
                raise ClusterError(
                    f"the Ray cluster had no room for {n} inference engines of {self.bundle()} each within "
                    f"{wait_s:g} s "
                    "([inference] engines, gpus_per_engine, [cluster] engine_cpus, worker_wait_s); see `ray status`"
                ) from exc
            actor: Any = ray.remote(EngineActor)
            bundle = self.bundle()
            log_dir = str(self.run.output_dir / "engines")
            for i in range(n):
                self.handles.append(
                    actor.options(
                        name=engine_actor_name(self.run_id, i),
                        namespace=NAMESPACE,
                        num_cpus=bundle["CPU"],
                        num_gpus=bundle.get("GPU", 0),
                        max_restarts=0,
                        scheduling_strategy=PlacementGroupSchedulingStrategy(
                            self.group, placement_group_bundle_index=i
                        ),
                    ).remote(
                        self.config,
                        i,
                        self.run.model.name,
                        self.token,
                        self.run.run.seed,
                        self.run.model.update_policy,
                        log_dir,
                    )
                )
            driver_ip = node_ip()
            # The engine's own wait bounds each start (startup_timeout_s); this one bounds an actor that never ran.
            starts = [h.start.remote(driver_ip) for h in self.handles]  # all at once: engines load for minutes
            timeout_s = self.config.startup_timeout_s + wait_s
            return list(await asyncio.gather(*(_started(ref, i, timeout_s) for i, ref in enumerate(starts))))
        except BaseException:
            self.kill()
            raise

    def kill(self) -> None:
        """Stop each engine (its guard stops its process group), end the actors, free the group."""
        from ray.util.placement_group import remove_placement_group

        stops = [h.stop.remote() for h in self.handles]
        with contextlib.suppress(Exception):
            ray.wait(stops, num_returns=len(stops), timeout=30.0)
        for handle in self.handles:
            with contextlib.suppress(Exception):
                ray.kill(handle, no_restart=True)
        self.handles = []
        if self.group is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(self.group)
            self.group = None


async def _within(ref: Any, timeout_s: float) -> Any:
    return await asyncio.wait_for(asyncio.wrap_future(ref.future()), timeout_s)


async def _started(ref: Any, index: int, timeout_s: float) -> str:
    try:
        url: str = await _within(ref, timeout_s)
        return url
    except TimeoutError as exc:
        raise ClusterError(
            f"inference engine {index}'s actor did not start within {timeout_s:g} s; see `ray status`"
        ) from exc
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause
        if isinstance(cause, SandrlError):
            raise type(cause)(str(cause)) from None  # the engine's own error (its log's tail), not Ray's wrapping
        raise ClusterError(f"inference engine {index} failed to start on the cluster: {cause or exc}") from exc
    except ray.exceptions.RayActorError as exc:
        raise ClusterError(f"inference engine {index}'s actor died while starting: {exc}") from exc


def router_host() -> str:
    """Loopback when every node of the cluster is this machine, else the driver's address."""
    here = node_ip()
    nodes = {n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")}  # type: ignore[no-untyped-call]
    return HOST if nodes <= {here} else here


@contextlib.asynccontextmanager
async def cluster_fleet(run: RunConfig, cluster: ClusterConfig, run_id: str) -> AsyncIterator[Fleet]:
    """The run's engines behind one router served on this loop: launched as actors (``[inference] launch``),
    or the ``[cluster] inference`` URLs; ended with the context (see the module docstring)."""
    fleet_config = run.inference
    group: EngineGroup | None = None
    token: str | None
    if fleet_config.launched:
        if cluster.inference:
            raise ConfigError(
                "[inference] launch starts the engines and [cluster] inference names engines started elsewhere: "
                "give one of them"
            )
        group = EngineGroup(run, cluster.options, run_id)
        urls, token = await group.start(), group.token
    else:
        urls, token = list(cluster.endpoints(run)), run.model.http().api_key
    try:
        async with open_fleet(
            dataclasses.replace(fleet_config, launch=""),
            model=run.model.name,
            log_dir=run.output_dir / "engines",
            attach=urls,
            token=token,
            host=router_host(),
        ) as fleet:
            yield fleet
    finally:
        if group is not None:
            group.kill()
