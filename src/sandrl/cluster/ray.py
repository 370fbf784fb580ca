"""Rollout workers and the trainer as Ray actors; the sandbox hosts and inference servers are URLs.

::

    driver (sandrl train --ray)                 Ray actors
      Session + the sync or async driver  ──►   RolloutWorker x N   (RolloutRunner over a FleetProvider)
      ClusterSource: dispatch, re-issue   ──►   TrainerWorker       (Trainer.step, checkpoints, weight export)
      EndpointsClient: push weights       ──►   inference servers   (URLs)

Only this module and :mod:`sandrl.cluster.dispatch` import Ray, and only ``sandrl train --ray`` and
``sandrl bench cluster`` import them. A rollout worker that dies is restarted by Ray
(``max_restarts``); its in-flight groups are re-issued by the driver (:mod:`sandrl.cluster.dispatch`).
The trainer actor is not restarted: a run whose trainer died resumes from its last checkpoint.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import ray

from sandrl.cluster.config import ClusterOptions
from sandrl.cluster.worker import RolloutWorker, WorkerSpec
from sandrl.errors import ClusterError
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

        from sandrl.train.driver_common import make_trainer

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

    def save_checkpoint(self, root: str, data_position: int, data_done: tuple[int, ...]) -> str:
        self.trainer.data_position, self.trainer.data_done = data_position, data_done
        return str(self.trainer.save_checkpoint(root))

    def trained_episode_ids(self) -> list[str]:
        """Every episode id a step trained on, in order (a sample per trainable episode)."""
        return list(self.trained)

    def pid(self) -> int:
        return os.getpid()


class RemoteTrainer:
    """The driver's view of the trainer actor: what :class:`~sandrl.train.driver_common.Session` calls."""

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

    def save_checkpoint(self, root: str | Path) -> Path:
        return Path(ray.get(self.handle.save_checkpoint.remote(str(root), self.data_position, self.data_done)))

    def trained_episode_ids(self) -> list[str]:
        ids: list[str] = ray.get(self.handle.trained_episode_ids.remote())
        return ids

    def kill(self) -> None:
        ray.kill(self.handle)

    def close(self) -> None:
        """The session is done with it; the cluster's driver ends the actor (:meth:`kill`)."""


def stop(handles: list[Any], timeout_s: float = 30.0) -> None:
    """Let each worker close its clients, then end the actors."""
    refs = [h.close.remote() for h in handles]
    try:
        ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    finally:
        for handle in handles:
            ray.kill(handle, no_restart=True)
