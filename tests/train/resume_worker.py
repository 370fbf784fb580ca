"""A training run that checkpoints every step, for the kill -9 test (``python -m tests.train.resume_worker``).

Its data is drawn from every random generator a run may use (torch, Python, NumPy), so only a
resume that restores all of them, with the model, the optimizer and the data position,
continues bit for bit.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import numpy as np
import torch

from sandrl.train import checkpoint
from sandrl.train.batch import Batch, TrainSample, samples_from_groups
from sandrl.train.config import TrainConfig
from sandrl.train.losses import LossConfig
from sandrl.train.trainer import Trainer

from .helpers import make_trainer, sample

PROMPTS = ("add two numbers", "list the files", "fix the bug", "print hello", "sort a list")
CONFIG = TrainConfig(
    lr=2e-2,
    warmup_steps=2,
    weight_decay=0.01,
    minibatches=2,
    micro_batch_tokens=64,
    loss=LossConfig(loss_type="dapo", epsilon_high=0.28, tis_cap=2.0),
)


def next_batch(trainer: Trainer) -> Batch:
    """The batch at the trainer's data position: a prompt, random outputs, rewards, noisy rollout log-probs."""
    prompt = PROMPTS[trainer.data_position % len(PROMPTS)]
    group: list[TrainSample] = []
    for _ in range(4):
        length = random.randint(1, 6)
        output = bytes(torch.randint(ord("a"), ord("z") + 1, (length,)).tolist()).decode()
        reward = float(sum(c < "n" for c in output) / length + np.random.normal(0, 0.01))
        group.append(sample(prompt, output, reward=reward, group_id=prompt))
    own = trainer.logprobs(group)
    noisy = [
        TrainSample(
            token_ids=s.token_ids,
            loss_mask=s.loss_mask,
            rollout_logprobs=tuple(
                lp - 0.3 * float(torch.rand(())) if m else 0.0 for lp, m in zip(lps, s.loss_mask, strict=True)
            ),
            reward=s.reward,
            group_id=s.group_id,
        )
        for s, lps in zip(group, own, strict=True)
    ]
    return samples_from_groups([noisy])


def run(directory: Path, steps: int, *, resume: bool) -> Trainer:
    torch.manual_seed(1234)
    random.seed(1234)
    np.random.seed(1234)
    trainer = make_trainer(CONFIG)
    found = checkpoint.latest(directory) if resume else None
    if found is not None:
        trainer.load_checkpoint(found)
    while trainer.steps < steps:
        batch = next_batch(trainer)
        trainer.step(batch)
        trainer.data_position += 1
        trainer.save_checkpoint(directory)
        print(f"saved {trainer.steps}", flush=True)
    return trainer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("directory", type=Path)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    run(args.directory, args.steps, resume=args.resume)
    print("done", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
