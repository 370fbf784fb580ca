"""Real training steps in fresh processes; prints each rank's RSS growth (``python -m tests.train.peak_worker``).

The growth is measured from just before the model is built to the process's peak (``VmHWM``)
after a step: the parameters, the reference, the optimizer state (made by a first, tiny step),
and the peak of the measured step of two micro-batches per rank (its gradients, activations and
log-prob buffers). A tiny trainer runs first, so that code loaded on first use (kernels, lazy
imports) is not counted.

A config that trains as FSDP2 ranks (several processes, or bf16: :func:`~sandrl.train.ranks.needs_ranks`)
runs as that many processes of one gloo group over loopback, each measuring itself.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import transformers

from sandrl.train.batch import Batch, TrainSample
from sandrl.train.config import TrainConfig
from sandrl.train.ranks import needs_ranks
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
    vocab, ranks = int(hf_config.vocab_size), config.processes
    tiny = transformers.Qwen3Config(
        vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8,
    )  # fmt: skip
    warm = Trainer(transformers.Qwen3ForCausalLM(tiny).float(), config)
    warm.step(samples(2 * ranks, 16, vocab, 1))
    warm.step(samples(2 * ranks, 16, vocab, 2))
    del warm
    gc.collect()
    # Two micro-batches a rank: the second one's backward runs with the first one's gradients held.
    big = samples(2 * ranks * config.micro_batch_tokens // length, length, vocab, 3)
    before = status_bytes("VmRSS")
    torch.manual_seed(0)
    auto: Any = transformers.AutoModelForCausalLM
    trainer = Trainer(auto.from_config(hf_config).float(), config)
    trainer.step(samples(2 * ranks, 8, vocab, 4))  # the optimizer's state exists from here on
    trainer.step(big)
    return status_bytes("VmHWM") - before


def _rank(rank: int, store: str, model_dir: Path, config: TrainConfig, length: int, out: Any = None) -> int:
    torch.set_num_threads(1)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=config.processes)
    try:
        growth = measure(model_dir, config, length)
    finally:
        dist.destroy_process_group()
    if out is not None:
        out.put(growth)
    return growth


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("train", help="the [train] table as JSON")
    parser.add_argument("--length", type=int, required=True, help="tokens per sample")
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = TrainConfig.from_mapping(json.loads(args.train))
    if not needs_ranks(config):
        growth = [measure(args.model_dir, config, args.length)]
    else:  # rank 0 here, the others in processes of their own
        store = tempfile.mktemp(prefix="sandrl-peak-")
        context = mp.get_context("spawn")
        queue = context.Queue()
        others = [
            context.Process(target=_rank, args=(r, store, args.model_dir, config, args.length, queue))
            for r in range(1, config.processes)
        ]
        for proc in others:
            proc.start()
        growth = [_rank(0, store, args.model_dir, config, args.length)]
        growth += [queue.get(timeout=300) for _ in others]
        for proc in others:
            proc.join(timeout=60)
    print(json.dumps({"growth": growth}))


if __name__ == "__main__":
    main()
