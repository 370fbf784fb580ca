"""A tiny Qwen3 policy trained with LoRA for a few steps, and what it exports: shared by the LoRA tests."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sandrl.inference.model import build_tiny_model
from sandrl.inference.tiny_config import TinyModelConfig
from sandrl.inference.tokenizer import ByteTokenizer
from sandrl.train.lora import apply_lora, export_lora
from sandrl.train.lora_config import LoraConfig

QWEN3 = TinyModelConfig(architecture="qwen3")
LORA = LoraConfig(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj", "o_proj", "down_proj"))
TEXT = "the adapter learns this sentence by heart"


@dataclass
class Trained:
    base: Any
    """An untouched copy of the base model (what a server starts from)."""
    policy: Any
    """The peft model after a few AdamW steps on a supervised loss."""
    tokenizer: ByteTokenizer
    merged: Path
    adapter: Path


def supervised_steps(policy: Any, tokenizer: ByteTokenizer, steps: int, lr: float = 3e-2) -> None:
    """A small manual loop: AdamW on the next-token loss of :data:`TEXT`, over the parameters that require grad."""
    ids = torch.tensor([tokenizer.encode(TEXT)])
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=lr)
    policy.train()
    for _ in range(steps):
        policy(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    policy.eval()


def train_and_export(directory: Path, *, steps: int = 4) -> Trained:
    model, tokenizer = build_tiny_model(QWEN3)
    base = copy.deepcopy(model)
    policy = apply_lora(model, LORA)
    supervised_steps(policy, tokenizer, steps)
    merged = export_lora(policy, directory / "merged", LORA, tokenizer)
    adapter = export_lora(policy, directory / "adapter", LoraConfig(**{**LORA.__dict__, "export": "adapter"}))
    return Trained(base, policy, tokenizer, merged, adapter)


def policy_logprobs(model: Any, prompt: list[int], output: list[int]) -> list[float]:
    """Log-probs of ``output`` after ``prompt`` from one full forward of ``model`` (no cache, no batching)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + output])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    return [float(logprobs[len(prompt) + i - 1, token]) for i, token in enumerate(output)]
