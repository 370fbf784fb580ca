"""Rollout workers and the trainer as Ray actors; the sandbox hosts and inference servers are URLs.

::

    driver (sandrl train --ray)                 Ray actors
      Session + the sync or async driver  ──►   RolloutWorker x N   (RolloutRunner over a FleetProvider)
      ClusterSource: dispatch, re-issue   ──►   TrainerWorker       (Trainer.step, checkpoints, weight export)
      router: episodes, weight pushes     ──►   EngineActor x M     (sandrl.cluster.engines), or URLs

Only this module, :mod:`sandrl.cluster.dispatch` and :mod:`sandrl.cluster.engines` import Ray, and only
``sandrl train --ray`` and ``sandrl bench cluster`` import them. A rollout worker that dies is restarted by Ray
(``max_restarts``); its in-flight groups are re-issued by the driver (:mod:`sandrl.cluster.dispatch`).
The trainer actor is not restarted: a run whose trainer died resumes from its last checkpoint.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import Any

import ray

from sandrl.cluster.config import ClusterOptions
from sandrl.cluster.worker import RolloutWorker, WorkerSpec
from sandrl.errors import ClusterError, SandrlError, TrainError
from sandrl.inference.weight_push import BroadcastSpec
from sandrl.train import checkpoint, ranks
from sandrl.train.batch import Batch
from sandrl.train.run_config import RunConfig
from sandrl.train.trainer import ExportedWeights, Metrics

log = logging.getLogger(__name__)

NAMESPACE = "sandrl"


def connect(address: str) -> bool:
    """Join the Ray cluster at ``address`` (``auto``: the one started on this machine); True if this call joined.

    A process already connected (a test, a notebook) stays on its cluster and is not disconnected later.
    """
    if ray.is_initialized():
        return False
    try:
        ray.init(address=address, namespace=NAMESPACE, logging_level=logging.WARNING, configure_logging=False)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        raise ClusterError(
            f"cannot join the Ray cluster at {address!r}: {exc}; start one with `ray start --head` "
            "(then --ray auto on that machine, or --ray HEAD_IP:6379 elsewhere)"
        ) from exc
    return True


def disconnect() -> None:
    ray.shutdown()


def worker_name(run_id: str, index: int) -> str:
    """The Ray actor name of rollout worker ``index`` of a run (namespace :data:`NAMESPACE`)."""
    return f"sandrl-{run_id}-rollout-{index}"


def _started(refs: list[Any], what: str, timeout_s: float) -> list[Any]:
    try:
        return list(ray.get(refs, timeout=timeout_s))
    except ray.exceptions.GetTimeoutError as exc:
        raise ClusterError(
            f"the {what} did not start within {timeout_s:g} s: the cluster may lack the CPUs or GPUs they "
            "reserve ([cluster] worker_cpus, trainer_cpus, trainer_gpus); see `ray status`"
        ) from exc
    except ray.exceptions.RayActorError as exc:
        raise ClusterError(f"the {what} died while starting: {exc}") from exc


def start_workers(specs: list[WorkerSpec], options: ClusterOptions) -> list[Any]:
    """One restartable rollout-worker actor per spec, spread over the nodes; returns once each answers."""
    actor: Any = ray.remote(RolloutWorker)
    handles = []
    for spec in specs:
        handle = actor.options(
            name=spec.name,
            namespace=NAMESPACE,
            max_restarts=options.max_restarts,
            max_task_retries=0,
            num_cpus=options.worker_cpus,
            scheduling_strategy="SPREAD",
        ).remote(spec)
        handles.append(handle)
    try:
        _started([h.pid.remote() for h in handles], "rollout workers", options.worker_wait_s)
    except ClusterError:
        for handle in handles:
            ray.kill(handle, no_restart=True)
        raise
    return handles


class TrainerWorker:
    """The trainer actor's body: a :class:`~sandrl.train.trainer.Trainer` on ``[model] name``, resumed if asked."""

    def __init__(self, config: RunConfig, threads: int | None = None) -> None:
        import torch

        from sandrl.train.session import make_trainer

        if threads is not None:
            torch.set_num_threads(threads)
        self.trainer = make_trainer(config)
        self.trained: list[str] = []

    def state(self) -> tuple[int, int, int, tuple[int, ...]]:
        t = self.trainer
        return t.steps, t.version, t.data_position, t.data_done

    def step(self, batch: Batch) -> tuple[Metrics, int, int]:
        metrics = self.trainer.step(batch)
        self.trained.extend(s.episode_id for s in batch.samples)
        return metrics, self.trainer.steps, self.trainer.version

    def export_weights(self, directory: str) -> ExportedWeights:
        return self.trainer.export_weights(directory)

    def broadcast_weights(self, spec: BroadcastSpec) -> str | None:
        return self.trainer.broadcast_weights(spec)

    def save_checkpoint(self, root: str, data_position: int, data_done: tuple[int, ...]) -> str:
        self.trainer.data_position, self.trainer.data_done = data_position, data_done
        return str(self.trainer.save_checkpoint(root))

    def trained_episode_ids(self) -> list[str]:
        """Every episode id a step trained on, in order (a sample per trainable episode)."""
        return list(self.trained)

    def pid(self) -> int:
        return os.getpid()


class RemoteTrainer:
    """The driver's view of the trainer actor: what :class:`~sandrl.train.session.Session` calls."""

    def __init__(self, config: RunConfig, options: ClusterOptions, threads: int | None = None) -> None:
        actor: Any = ray.remote(TrainerWorker)
        self.handle: Any = actor.options(
            num_cpus=options.trainer_cpus, num_gpus=options.trainer_gpus, max_restarts=0
        ).remote(config, threads)
        try:
            (self.steps, self.version, self.data_position, self.data_done), *_ = _started(
                [self.handle.state.remote()], "trainer actor", options.worker_wait_s
            )
        except ClusterError:
            ray.kill(self.handle)
            raise

    def step(self, batch: Batch) -> Metrics:
        metrics: Metrics
        metrics, self.steps, self.version = ray.get(self.handle.step.remote(batch))
        return metrics

    def export_weights(self, directory: str | Path) -> ExportedWeights:
        exported: ExportedWeights = ray.get(self.handle.export_weights.remote(str(directory)))
        return exported

    def broadcast_weights(self, spec: BroadcastSpec) -> str | None:
        """The actor joins the engines' weight-update group (once) and sends the weights; see :class:`Trainer`."""
        why: str | None = ray.get(self.handle.broadcast_weights.remote(spec))
        return why

    def save_checkpoint(self, root: str | Path) -> Path:
        return Path(ray.get(self.handle.save_checkpoint.remote(str(root), self.data_position, self.data_done)))

    def trained_episode_ids(self) -> list[str]:
        ids: list[str] = ray.get(self.handle.trained_episode_ids.remote())
        return ids

    def kill(self) -> None:
        ray.kill(self.handle)

    def close(self) -> None:
        """The session is done with it; the cluster's driver ends the actor (:meth:`kill`)."""


class TrainerRank:
    """One training rank as a Ray actor: ``[train] processes`` of them in one placement group."""

    def __init__(self, rank: int, size: int, spec: ranks.RankSpec, threads: int | None = None) -> None:
        self.rank, self.size, self.spec, self.threads = rank, size, spec, threads
        self.trainer: Any = None
        self.trained: list[str] = []

    def node(self) -> tuple[str, str]:
        """This actor's Ray node id and address."""
        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]

    def free_port(self, host: str) -> int:
        """A port free on ``host`` for the group's rendezvous (rank 0 listens on it)."""
        with socket.socket() as probe:
            probe.bind((host, 0))
            port: int = probe.getsockname()[1]
            return port

    def start(self, init_method: str, loopback: bool) -> tuple[int, int, int, tuple[int, ...]]:
        import torch

        self.trainer = ranks.start_rank(self.rank, self.size, init_method, self.spec, loopback=loopback)
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        return ranks.rank_state(self.trainer)

    def call(self, method: str, args: tuple[Any, ...]) -> Any:
        result = ranks.answer(self.trainer, method, args)
        if method == "step":
            self.trained.extend(s.episode_id for s in args[0].samples)
        return result

    def trained_episode_ids(self) -> list[str]:
        return list(self.trained)


class RemoteRanks(ranks.RankCalls):
    """The driver's view of ``[train] processes`` rank actors in one placement group (one bundle of
    ``trainer_cpus`` and ``trainer_gpus`` each, packed on as few nodes as fit), as SkyRL and verl place
    them. Every call goes to every rank; rank 0's answer comes back. A rank that dies ends the call,
    stops the others, and the run resumes from its last checkpoint."""

    def __init__(self, config: RunConfig, options: ClusterOptions, threads: int | None = None) -> None:
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        size = config.train.processes
        last = checkpoint.latest(config.output_dir / "checkpoints") if config.run.resume else None
        spec = ranks.RankSpec(config.model.name, config.train, resume_from=str(last) if last else None)
        bundle = {"CPU": options.trainer_cpus, **({"GPU": options.trainer_gpus} if options.trainer_gpus else {})}
        self.group: Any = placement_group([bundle] * size, strategy="PACK")
        self._remove = remove_placement_group
        self.handles: list[Any] = []
        try:
            try:
                ray.get(self.group.ready(), timeout=options.worker_wait_s)
            except ray.exceptions.GetTimeoutError as exc:
                raise ClusterError(
                    f"the cluster has no room for {size} training ranks of {bundle} each within "
                    f"{options.worker_wait_s:g} s ([train] processes, [cluster] trainer_cpus, trainer_gpus); "
                    "see `ray status`"
                ) from exc
            actor: Any = ray.remote(TrainerRank)
            self.handles = [
                actor.options(
                    num_cpus=options.trainer_cpus,
                    num_gpus=options.trainer_gpus,
                    max_restarts=0,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=r),
                ).remote(r, size, spec, threads)
                for r in range(size)
            ]
            nodes = _started([h.node.remote() for h in self.handles], "training ranks", options.worker_wait_s)
            # Ranks of one node rendezvous and talk over loopback; across nodes, at rank 0's address.
            loopback = len({node for node, _ in nodes}) == 1
            host = "127.0.0.1" if loopback else nodes[0][1]
            port = ray.get(self.handles[0].free_port.remote(host))
            starts = [h.start.remote(f"tcp://{host}:{port}", loopback) for h in self.handles]
            self.steps, self.version, self.data_position, self.data_done = self._gather(starts, "start")
        except BaseException:
            self.kill()
            raise

    def trained_episode_ids(self) -> list[str]:
        ids: list[str] = ray.get(self.handles[0].trained_episode_ids.remote())
        return ids

    def kill(self) -> None:
        for handle in self.handles:
            ray.kill(handle, no_restart=True)
        self.handles = []
        self._remove(self.group)

    def close(self) -> None:
        """The session is done with them; the cluster's driver ends the actors (:meth:`kill`)."""

    def _call(self, method: str, *args: Any) -> Any:
        if not self.handles:
            raise TrainError("the training ranks were stopped after an earlier failure; rerun to resume")
        return self._gather([h.call.remote(method, args) for h in self.handles], method)

    def _gather(self, refs: list[Any], method: str) -> Any:
        try:
            return ray.get(refs)[0]
        except ray.exceptions.RayActorError as exc:
            self.kill()
            raise TrainError(
                f"a training rank died during {method} ({str(exc).splitlines()[0]}); the other ranks were stopped. "
                "Rerun the same command to resume from the last checkpoint"
            ) from exc
        except SandrlError:
            self.kill()  # the other ranks may wait in a collective for the one that failed
            raise


def remote_trainer(
    config: RunConfig, options: ClusterOptions, threads: int | None = None
) -> RemoteTrainer | RemoteRanks:
    """The run's trainer on the cluster: rank actors in a placement group when ``[train]`` asks for FSDP2
    (several processes, bf16, offloading), else one trainer actor."""
    if ranks.needs_ranks(config.train):
        return RemoteRanks(config, options, threads)
    return RemoteTrainer(config, options, threads)


def stop(handles: list[Any], timeout_s: float = 30.0) -> None:
    """Let each worker close its clients, then end the actors."""
    refs = [h.close.remote() for h in handles]
    try:
        ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    finally:
        for handle in handles:
            ray.kill(handle, no_restart=True)
