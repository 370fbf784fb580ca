"""One training run in this process: :func:`run_training` picks the driver and returns the last step.

``sandrl train`` (:mod:`sandrl.cli.train`), ``sandrl demo`` and ``sandrl bench train`` call it. The
run writes under ``[run] output_dir``: ``config.toml`` (the resolved config), ``metrics.jsonl``
(one line per step), ``rollouts.jsonl`` and ``checkpoints/``; started again, it resumes from the
newest checkpoint. A run whose checkpoint already holds all ``[run] steps`` trains nothing: it says
so, and how to train on, without starting sandboxes or a server. With ``[warm_start] enabled`` the
run first fine-tunes its model on reference solutions (once, into ``warm_start/``:
:mod:`sandrl.train.warm_run`) and trains RL from there.

Cancelled (``sandrl train`` cancels it on SIGINT or SIGTERM: :mod:`sandrl.interrupt`), a run lets
its step in flight end, saves a checkpoint of every step done, and closes its sandboxes and
servers before the cancellation goes on; :func:`saved_line` then says what is on disk and how to
go on from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from pathlib import Path
from typing import Any

from rich.console import Console

from sandrl.errors import ConfigError
from sandrl.rollout.agent import Agent
from sandrl.sandbox.base import SandboxProvider
from sandrl.train import async_, checkpoint, sync
from sandrl.train.device import check_dtype, torch_device
from sandrl.train.plan import check_fits
from sandrl.train.run_config import MODES, RunConfig
from sandrl.train.session import open_session
from sandrl.train.warm_run import WarmStarted, WarmStartStopped, warm_start_run
from sandrl.wiring import open_policy


async def run_training(
    config: RunConfig,
    *,
    mode: str | None = None,
    load_rollouts: str | Path | None = None,
    rollout_only: bool = False,
    provider: SandboxProvider | None = None,
    agent: Agent | None = None,
    console: Console | None = None,
    device_memory: int | None = None,
) -> dict[str, Any]:
    """Run ``config`` with the driver of ``mode`` (default: the config's); the last step's metrics.

    ``--load-rollouts`` always uses the synchronous loop: there is no sampling to overlap with.
    A trainer that will not fit its device (:func:`~sandrl.train.plan.check_fits`; ``device_memory``
    in bytes replaces what the device reports) is refused before anything starts.
    """
    chosen = mode or config.run.mode
    if chosen not in MODES:
        raise ConfigError(f"--mode must be one of {', '.join(MODES)}, got {chosen!r}")
    driver = sync if load_rollouts is not None or chosen == "sync" else async_
    if not rollout_only:
        # Before the run writes anything or starts a sandbox.
        check_dtype(config.train.dtype, torch_device(config.train.device))
        check_fits(config, device_memory=device_memory)
    if config.run.resume and not rollout_only:
        done = checkpoint.steps_done(config.output_dir / "checkpoints")
        if done >= config.run.steps:
            return _complete(config, done, console or Console(stderr=True))
    config, warm = await _warm_start(config, console)
    if warm is not None and not config.model.embedded and load_rollouts is None:
        await _serve_warm_start(config)
    last: dict[str, Any] = {}
    async with open_session(
        config,
        mode=chosen,
        load_rollouts=load_rollouts,
        rollout_only=rollout_only,
        provider=provider,
        agent=agent,
        console=console,
    ) as session:
        try:
            await driver.run(session)
        except asyncio.CancelledError:
            trainer = session.trainer
            if trainer is not None and checkpoint.steps_done(config.output_dir / "checkpoints") < trainer.steps:
                session.save_checkpoint()  # every step done survives the stop
            raise
        last = {"steps": session.batches, "weight_version": session.version, "output_dir": str(config.output_dir)}
        lines = (config.output_dir / "metrics.jsonl").read_text().splitlines()
        if lines:
            last = {**json.loads(lines[-1]), **last}
    return last


async def _warm_start(config: RunConfig, console: Console | None) -> tuple[RunConfig, WarmStarted | None]:
    """:func:`warm_start_run` in a worker thread: the event loop stays free to take SIGINT and SIGTERM,
    which end the warm start at its next update."""
    stop = threading.Event()
    work = asyncio.ensure_future(asyncio.to_thread(warm_start_run, config, console=console, stop=stop))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        stop.set()
        with contextlib.suppress(WarmStartStopped):
            await work
        raise


async def _serve_warm_start(config: RunConfig) -> None:
    """Load the warm-started weights into the inference server, as version 0: its first samples are the
    warm start's (a resumed run then pushes its checkpoint's weights over them)."""
    async with open_policy(config.model) as policy:
        await policy.update_weights(config.model.name, version=0)


def _complete(config: RunConfig, done: int, console: Console) -> dict[str, Any]:
    """What a run that has nothing left to train prints and returns: its last step, marked complete."""
    out = config.output_dir
    console.print(
        f"the run in {out} is complete: {done} of {config.run.steps} steps done, nothing trained now. "
        f"To train on from its last checkpoint, raise the steps (--steps {done + config.run.steps}); "
        "for a new run, --output-dir ANOTHER_DIR",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    metrics = out / "metrics.jsonl"
    lines = metrics.read_text().splitlines() if metrics.is_file() else []
    last = json.loads(lines[-1]) if lines else {}
    return {**last, "steps": done, "output_dir": str(out), "complete": True}


def saved_line(config: RunConfig, *, rollout_only: bool = False) -> str:
    """What a stopped run left on disk, and how to go on from it, for the line ``interrupted: ...``."""
    out = config.output_dir
    if rollout_only:
        rollouts = out / "rollouts.jsonl"
        kept = sum(1 for _ in rollouts.open()) if rollouts.is_file() else 0
        return f"{kept} trajectories in {rollouts} (a rerun with --rollout-only collects from the start again)"
    root = out / "checkpoints"
    last = checkpoint.latest(root)
    if last is None:
        return f"0/{config.run.steps} steps done, no checkpoint in {root}: rerun the same command to start again"
    saved = f"{checkpoint.steps_done(root)}/{config.run.steps} steps, checkpoint {last.name} in {root}"
    if not config.run.resume:
        return f"{saved}; [run] resume is false: rerun with --set run.resume=true to resume from it"
    return f"{saved}, rerun the same command to resume"
