"""Fixtures of the driver tests: real bwrap sandboxes, the tiny embedded engine, a policy-driven test agent.

:class:`~tests.cluster.agents.ParityAgent` is the one fake, at the agent edge: it samples a few
tokens from the real policy and runs the task's reference solution when the first sampled token
is even, so rewards vary within a group (GRPO has a signal) and depend on the policy (it is
learnable), while the sandbox, verifier, engine, trainer and drivers are all real.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from sandrl.rollout.jsonl import write_jsonl
from sandrl.rollout.trajectory import Trajectory
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.train.run_config import RunConfig, from_dict

from ..cluster.agents import ParityAgent
from ..support import REASON

__all__ = ["ParityAgent", "run_config", "write_saved_groups"]


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BwrapProvider]:
    if REASON is not None:
        pytest.skip(REASON)
    p = BwrapProvider(tmp_path_factory.mktemp("driver-state"))
    yield p
    p._close_all_sync()


def run_config(out: Path, **sections: dict[str, Any]) -> RunConfig:
    """A small run on generated echo tasks under ``out``; ``sections`` override tables key by key."""
    data: dict[str, dict[str, Any]] = {
        "run": {"output_dir": str(out), "steps": 3, "groups_per_step": 2},
        "tasks": {"family": "echo", "count": 8},
        "rollout": {"group_size": 4, "concurrency": 8, "max_turns": 1, "max_new_tokens": 8},
        "train": {"lr": 3e-2, "loss": {"loss_type": "dapo"}},
    }
    for name, table in sections.items():
        data.setdefault(name, {}).update(table)
    return from_dict(data)


def write_saved_groups(path: Path, groups: int = 4) -> Path:
    """``groups`` saved groups of two samples (rewards 0 and 1) at ``path``, as ``--load-rollouts`` reads."""
    write_jsonl(
        path,
        [
            Trajectory.from_dict(
                {
                    "episode_id": f"r/t#{g}/{i}",
                    "group_id": f"r/t#{g}",
                    "task_id": "t",
                    "sample_index": i,
                    "agent": "llm",
                    "status": "completed",
                    "reward": float(i),
                    "ids": [1, 2, 3, 4],
                    "loss_mask": [0, 1, 1, 1],
                    "logprobs": [0.0, -0.5, -0.25, -0.3],
                    "weight_version": 0,
                }
            )
            for g in range(groups)
            for i in range(2)
        ],
    )
    return path
