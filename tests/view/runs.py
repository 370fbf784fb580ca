"""Run directories made by the view tests: episodes as a run writes them, in any number."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sandrl.inference.tokenizer import ByteTokenizer
from sandrl.rollout.jsonl import dumps
from sandrl.rollout.trajectory import Trajectory, Turn


def trajectory(group: int, sample: int, *, task: str = "t", passed: bool | None = True, **fields: Any) -> Trajectory:
    """A small model episode of ``task`` in group ``run/<task>#<group>``: prompt, one reply, one observation."""
    tok = ByteTokenizer()
    ids = [tok.bos_token_id, tok.im_start_id, *b"task", tok.im_start_id, *b"reply", tok.im_end_id, *b"out"]
    mask = [0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0]
    values: dict[str, Any] = {
        "episode_id": f"run/{task}#{group}/{sample}",
        "group_id": f"run/{task}#{group}",
        "task_id": task,
        "sample_index": sample,
        "agent": "llm",
        "status": "completed",
        "stop_reason": "submitted",
        "reward": 1.0 if passed else 0.0,
        "passed": passed,
        "ids": ids,
        "loss_mask": mask,
        "logprobs": [-0.5 if m else 0.0 for m in mask],
        "prompt_len": 7,
        "turns": [Turn(0, "echo out", 7, 13, observation_start=13, observation_end=16, weight_version=0)],
        "weight_version": 0,
        "task_set": "family",
    }
    values.update(fields)
    return Trajectory(**values)


def write_run(directory: Path, episodes: list[Trajectory], metrics: list[dict[str, Any]]) -> Path:
    """A training run's directory as ``sandrl train`` writes it (config, metrics, rollouts)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.toml").write_text('[run]\nsteps = 4\n\n[model]\nname = "tiny"\n')
    (directory / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    (directory / "rollouts.jsonl").write_text("".join(dumps(t) + "\n" for t in episodes))
    return directory
