"""One real training step in a fresh process; prints how much its RSS grew (``python -m tests.train.peak_worker``).

The growth is measured from just before the model is built to the process's peak (``VmHWM``)
after a step: the parameters, the reference, the optimizer state (made by a first, tiny step),
and the peak of the measured step of two micro-batches (its gradients, activations and log-prob
buffers). A tiny trainer runs first, so that code loaded on first use (kernels, lazy imports) is
not counted.
"""

from __future__ import annotations

import argparse
import gc
import json
from pathlib import Path

import torch
import transformers

from sandrl.train.batch import Batch, TrainSample
from sandrl.train.config import TrainConfig
from sandrl.train.trainer import Trainer


def status_bytes(key: str) -> int:
    """``VmRSS``/``VmHWM`` of this process, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def samples(count: int, length: int, vocab: int, seed: int) -> Batch:
    """``count`` samples of ``length`` random tokens, every one after the first trained, advantages +-1."""
    generator = torch.Generator().manual_seed(seed)
    items = [
        TrainSample(
            token_ids=tuple(torch.randint(0, vocab, (length,), generator=generator).tolist()),
            loss_mask=(0, *([1] * (length - 1))),
            rollout_logprobs=(0.0,) * length,
            advantage=1.0 if i % 2 else -1.0,
            group_id="g",
        )
        for i in range(count)
    ]
    return Batch.of(items)


def measure(model_dir: Path, config: TrainConfig, length: int) -> int:
    hf_config = transformers.AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    vocab = int(hf_config.vocab_size)
    tiny = transformers.Qwen3Config(
        vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8,
    )  # fmt: skip
    warm = Trainer(transformers.Qwen3ForCausalLM(tiny).float(), config)
    warm.step(samples(2, 16, vocab, 1))
    warm.step(samples(2, 16, vocab, 2))
    del warm
    gc.collect()
    # Two micro-batches: the second one's backward runs with the first one's gradients held, as in a real step.
    big = samples(2 * config.micro_batch_tokens // length, length, vocab, 3)
    before = status_bytes("VmRSS")
    torch.manual_seed(0)
    trainer = Trainer(transformers.AutoModelForCausalLM.from_config(hf_config).float(), config)
    trainer.step(samples(2, 8, vocab, 4))  # the optimizer's state exists from here on
    trainer.step(big)
    return status_bytes("VmHWM") - before


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("train", help="the [train] table as JSON")
    parser.add_argument("--length", type=int, required=True, help="tokens per sample")
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = TrainConfig.from_mapping(json.loads(args.train))
    print(json.dumps({"growth": measure(args.model_dir, config, args.length)}))


if __name__ == "__main__":
    main()
