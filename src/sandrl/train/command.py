"""``sandrl train CONFIG [--mode sync|async] [--load-rollouts FILE] [--rollout-only] [--ray auto|ADDRESS]``.

::

    sandrl train configs/tiny.toml                      # the [run] mode (sync by default)
    sandrl train configs/tiny.toml --mode async
    sandrl train configs/tiny.toml --rollout-only       # collect into rollouts.jsonl, no training
    sandrl train configs/tiny.toml --load-rollouts runs/tiny/rollouts.jsonl   # no sandboxes, no server
    sandrl train cluster.toml --ray auto                # on a Ray cluster: see sandrl.cluster.training

The run writes under ``[run] output_dir``: ``config.toml`` (the resolved config), ``metrics.jsonl``
(one line per step), ``rollouts.jsonl`` and ``checkpoints/``; started again, it resumes from the
newest checkpoint. It prints a progress line per step on stderr and ends with one JSON line on
stdout (the last step's metrics).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from rich.console import Console

from sandrl.errors import ConfigError
from sandrl.rollout.agent import Agent
from sandrl.sandbox.base import SandboxProvider
from sandrl.train import async_, sync
from sandrl.train.driver_common import open_session
from sandrl.train.run_config import MODES, RunConfig, load_run_config


async def run_training(
    config: RunConfig,
    *,
    mode: str | None = None,
    load_rollouts: str | Path | None = None,
    rollout_only: bool = False,
    provider: SandboxProvider | None = None,
    agent: Agent | None = None,
    console: Console | None = None,
) -> dict[str, Any]:
    """Run ``config`` with the driver of ``mode`` (default: the config's); the last step's metrics.

    ``--load-rollouts`` always uses the synchronous loop: there is no sampling to overlap with.
    """
    chosen = mode or config.run.mode
    if chosen not in MODES:
        raise ConfigError(f"--mode must be one of {', '.join(MODES)}, got {chosen!r}")
    driver = sync if load_rollouts is not None or chosen == "sync" else async_
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
        await driver.run(session)
        last = {"steps": session.batches, "weight_version": session.version, "output_dir": str(config.output_dir)}
        lines = (config.output_dir / "metrics.jsonl").read_text().splitlines()
        if lines:
            last = {**json.loads(lines[-1]), **last}
    return last


def train(
    config_path: Path,
    mode: str | None = None,
    load_rollouts: Path | None = None,
    rollout_only: bool = False,
    ray: str | None = None,
) -> None:
    """The body of ``sandrl train``: load and check the config, run, print the last step as one JSON line."""
    if ray is not None:
        if load_rollouts is not None:
            raise ConfigError("--load-rollouts trains on saved trajectories in this process: drop --ray")
        from sandrl.cluster.training import train_on_ray

        print(json.dumps(train_on_ray(config_path, ray, mode=mode, rollout_only=rollout_only)))
        return
    config = load_run_config(config_path)
    result = asyncio.run(run_training(config, mode=mode, load_rollouts=load_rollouts, rollout_only=rollout_only))
    print(json.dumps(result))
