"""``sandrl train CONFIG --ray auto|ADDRESS``: the same run, with rollouts and the trainer on a Ray cluster.

The drivers are the ones of one machine (:mod:`sandrl.train.sync`, :mod:`sandrl.train.async_`) over the
same :class:`~sandrl.train.session.Session`; what changes is where its parts run:

- the groups come from :class:`~sandrl.cluster.dispatch.ClusterSource` (rollout-worker actors, each a
  RolloutRunner over the fleet of sandbox hosts with its share of ``[rollout] concurrency``);
- the trainer is a :class:`~sandrl.cluster.ray.RemoteTrainer` (an actor; ``trainer_gpus`` puts it on a
  GPU node), which exports weights under ``[run] output_dir``: a directory the inference servers read
  (shared storage on a real cluster);
- the engines sit behind one router served by the driver (:mod:`sandrl.cluster.engines`): launched as Ray
  actors in a placement group (``[inference] launch``) or started elsewhere (``[cluster] inference``); the
  rollout workers sample through the router's URL (each episode on one engine) and the driver pushes the
  weights through it (to every engine).

Besides what a local run writes, the output directory gets ``cluster.toml`` (the resolved
``[cluster]`` section) and ``cluster.json`` (per-host metrics, the episode ledger, worker losses),
which is also the ``cluster`` entry of the result.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from sandrl.cluster.config import ClusterConfig, load_cluster_run, save_cluster
from sandrl.cluster.fleet import FleetConfig
from sandrl.cluster.hosts import merge
from sandrl.cluster.worker import WorkerSpec, concurrency_shares, router_client
from sandrl.errors import ClusterError, ConfigError
from sandrl.inference.transport import HTTPConfig
from sandrl.rollout.agent import Agent
from sandrl.rollout.jsonl import TrajectoryWriter
from sandrl.train.run_config import MODES, RunConfig, save_resolved
from sandrl.wiring import task_mix
from sandrl.wiring.policy import broadcasting


def require_ray() -> None:
    """Raise a ClusterError saying how to install Ray when it is missing."""
    try:
        import ray  # noqa: F401
    except ImportError as exc:
        raise ClusterError(
            "--ray needs Ray: install the cluster extra (`pip install -e '.[cluster]'`; `make setup` does)"
        ) from exc


def summarize_workers(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-host metrics merged over the workers' fleets, without the raw samples."""
    names = sorted({name for r in records for name in r.get("hosts", {})})
    return {name: merge([r["hosts"][name] for r in records if name in r.get("hosts", {})]) for name in names}


async def _worker_metrics(handle: Any, ray_lib: Any, *, wait_s: float) -> dict[str, Any]:
    """A worker's metrics at the end of a run. One that Ray is still restarting (killed late in the run)
    is waited for up to ``wait_s``, then counted as lost: the run's result must not fail on its report."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return dict(await handle.metrics.remote())
        except ray_lib.exceptions.RayActorError:
            if time.monotonic() >= deadline:
                return {"lost": True}
            await asyncio.sleep(0.5)


async def run_cluster_training(
    config: RunConfig,
    cluster: ClusterConfig,
    *,
    address: str,
    mode: str | None = None,
    rollout_only: bool = False,
    agent: Agent | None = None,
    console: Console | None = None,
) -> dict[str, Any]:
    """Run ``config`` on the Ray cluster at ``address``; the last step's metrics plus ``cluster``."""
    require_ray()
    import ray as ray_lib

    from sandrl.cluster import ray as cluster_ray
    from sandrl.cluster.dispatch import ClusterSource, WorkerPool
    from sandrl.cluster.engines import cluster_fleet
    from sandrl.train import async_, sync
    from sandrl.train.session import Session

    chosen = mode or config.run.mode
    if chosen not in MODES:
        raise ConfigError(f"--mode must be one of {', '.join(MODES)}, got {chosen!r}")
    if not config.inference.launched:
        cluster.endpoints(config)  # no engines at all: said before anything starts
    cluster = cluster.resolved()
    opts = cluster.options
    joined = cluster_ray.connect(address)
    out = config.output_dir
    save_resolved(config)
    save_cluster(cluster, out)
    run_id = Path(config.run.output_dir).name
    tasks = task_mix(config.tasks, out / "tasks", config.run.seed)  # the positions draw as on one machine
    shares = concurrency_shares(config.rollout.concurrency, opts.workers)
    handles: list[Any] = []
    trainer: cluster_ray.RemoteTrainer | cluster_ray.RemoteRanks | None = None
    writer = TrajectoryWriter(out / "rollouts.jsonl", append=True) if config.run.save_rollouts else None
    pool: WorkerPool | None = None
    session: Session | None = None
    result: dict[str, Any] = {}
    served: contextlib.AsyncExitStack = contextlib.AsyncExitStack()
    try:
        fleet = await served.enter_async_context(cluster_fleet(config, cluster, run_id))
        api = config.inference.client_api(config.model.api)
        specs = [
            WorkerSpec(
                name=cluster_ray.worker_name(run_id, i),
                run=config,
                hosts=cluster.hosts,
                inference=fleet.url,
                concurrency=share,
                run_id=run_id,
                agent=agent,
                fleet=FleetConfig(health_interval_s=opts.health_interval_s),
                inference_token=fleet.token,
                inference_api=api,
            )
            for i, share in enumerate(shares)
        ]
        # The trainer's weights go to every engine over a weight-update group that the trainer actor (its rank 0)
        # forms with them, where the engines take that ([inference] weight_sync); else through the router from disk.
        routed = router_client(specs[0], tokenizer=None)
        served.push_async_callback(routed.aclose)
        direct = HTTPConfig(api_key=fleet.token, retries=0)
        own = config.inference.launch == "embedded"
        policy = broadcasting(routed, config.inference, api, direct, config.model, engines=fleet, own=own)
        handles = cluster_ray.start_workers(specs, opts)
        trainer = None if rollout_only else cluster_ray.remote_trainer(config, opts, opts.trainer_threads or None)
        pool = WorkerPool(handles, shares, wait_s=opts.worker_wait_s)
        source = ClusterSource(
            pool,
            tasks,
            run_id,
            config.rollout.group_size,
            seed=config.run.seed,
            limit=tasks.limit,
            max_reissues=opts.max_reissues,
            writer=writer,
        )
        extra: dict[str, Any] = {"mode": chosen, **({"console": console} if console is not None else {})}
        session = Session(config, source, trainer, policy=policy, mix=tasks, **extra)
        await session.push_weights()  # a resumed run serves the checkpoint's weights
        await (sync if chosen == "sync" else async_).run(session)
        records = [await _worker_metrics(h, ray_lib, wait_s=opts.worker_wait_s) for h in handles]
        cluster_metrics = {
            "hosts": summarize_workers(records),
            "ledger": source.ledger.to_dict(),
            **pool.to_dict(),
            "reaped": sum(int(r.get("reaped", 0)) for r in records),
            "workers_unreported": sum(bool(r.get("lost")) for r in records),
        }
        if trainer is not None:
            trained = trainer.trained_episode_ids()
            cluster_metrics["episodes_trained"] = len(trained)
            cluster_metrics["episodes_trained_unique"] = len(set(trained))
        (out / "cluster.json").write_text(json.dumps(cluster_metrics, indent=2) + "\n")
        result = {"steps": session.batches, "weight_version": session.version, "output_dir": str(out)}
        lines = (out / "metrics.jsonl").read_text().splitlines()
        if lines:
            result = {**json.loads(lines[-1]), **result}
        result["cluster"] = cluster_metrics
    finally:
        if session is not None:
            session.close()
        if pool is not None:
            await pool.aclose()
        if handles:
            cluster_ray.stop(handles)
        if trainer is not None:
            trainer.kill()
        await served.aclose()
        if writer is not None:
            writer.close()
        if joined and ray_lib.is_initialized():
            cluster_ray.disconnect()
    return result


def train_on_ray(
    config_path: Path,
    address: str,
    mode: str | None = None,
    rollout_only: bool = False,
    overrides: Sequence[str] = (),
) -> dict[str, Any]:
    """The body of ``sandrl train CONFIG --ray ADDRESS``: the run's last step and the cluster's metrics."""
    config, cluster = load_cluster_run(config_path, overrides)
    if config.warm_start.enabled:
        raise ConfigError(
            "[warm_start] is not run under --ray: warm-start on one machine first (sandrl train CONFIG --warm-start "
            "--steps 1 --output-dir runs/warm writes runs/warm/warm_start/model), then set [model] name to that "
            "checkpoint, on storage the trainer and the inference servers read, and [warm_start] enabled = false"
        )
    return asyncio.run(run_cluster_training(config, cluster, address=address, mode=mode, rollout_only=rollout_only))
