"""Shared builders of the trainer tests: synthetic samples and model comparisons."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from sandrl.inference.model import build_tiny_model
from sandrl.inference.tiny_config import TinyModelConfig
from sandrl.inference.tokenizer import ByteTokenizer
from sandrl.train.batch import TrainSample
from sandrl.train.config import TrainConfig
from sandrl.train.trainer import Trainer

TINY = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64, seed=0)
"""Smaller than the default tiny model: these tests check arithmetic, not capacity."""


def make_trainer(config: TrainConfig | None = None, tiny: TinyModelConfig = TINY) -> Trainer:
    model, tokenizer = build_tiny_model(tiny)
    return Trainer(model, config or TrainConfig(lr=1e-2), tokenizer=tokenizer)


def sample(
    prompt: str,
    output: str,
    *,
    reward: float = 0.0,
    advantage: float = 0.0,
    group_id: str = "g",
    logprobs: Sequence[float] | None = None,
    masked: bool = True,
) -> TrainSample:
    """A one-turn sample: ``prompt`` (mask 0) then ``output`` (mask 1 unless ``masked`` is False)."""
    tok = ByteTokenizer()
    head = tok.encode_messages([{"role": "user", "content": prompt}], add_generation_prompt=True)
    tail = tok.encode(output)
    ids = head + tail
    mask = [0] * len(head) + [1 if masked else 0] * len(tail)
    return TrainSample(
        token_ids=tuple(ids),
        loss_mask=tuple(mask),
        rollout_logprobs=tuple(logprobs) if logprobs is not None else tuple(0.0 for _ in ids),
        reward=reward,
        advantage=advantage,
        group_id=group_id,
    )


def state_of(model: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
