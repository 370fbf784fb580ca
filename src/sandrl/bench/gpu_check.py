"""``python -m sandrl.bench.gpu_check``: the trainer on one GPU at a size people train (``scripts/gpu-check.sh``).

A Qwen3-0.6B-shaped model (hidden 1024, 28 layers, 16 heads, 8 key/value heads, head dim 128,
MLP 3072, vocabulary 151936, tied embeddings) with random weights is written to a temporary
directory, and trained the way ``sandrl train`` trains it with ``dtype = "bf16"``: as rank 0 of a
group of one (:func:`~sandrl.train.ranks.start_rank`; FSDP2 with bf16 compute and float32 master
weights), activation checkpointing, packed micro-batches. It reports

- **throughput**: tokens per second over the timed steps (after one untimed step), and the model
  FLOPs utilisation: ``6 x parameters x tokens/s`` over the GPU's dense bf16 peak (989 TFLOP/s, an
  H100 SXM's; ``--peak-tflops``), the convention that leaves out attention and recomputation;
- **memory**: ``torch.cuda.max_memory_allocated`` over those steps against the plan
  (:mod:`sandrl.train.plan`) of the same settings, for full fine-tuning and for LoRA rank 16;
- **agreement**: the trainer's log-probs of the same sequences, computed in bf16 on the GPU,
  against float32 on the CPU from the same checkpoint.

``--tiny`` runs the same code on a small model on the CPU (gloo; memory is the process's RSS
growth), so a test covers it where no GPU is. Prints one JSON line; ``--out`` writes it too.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sandrl.bench.tensor_peak import reset_peak_rss, rss_bytes
from sandrl.train.batch import Batch, TrainSample
from sandrl.train.config import TrainConfig
from sandrl.train.lora_config import LoraConfig
from sandrl.train.model_shape import ModelShape, model_shape

H100_BF16_TFLOPS = 989.0
"""An H100 SXM's dense bf16 tensor-core peak, TFLOP/s."""
GOAL_MFU = 0.40
"""Issue #39's goal for the 0.6B-shaped model with bf16, checkpointing and packing."""


CHECK_IMPORTS = ("transformers", "peft", "rich", "httpx", "zstandard", "pyyaml")
"""The distributions this check's code imports besides torch: the model's, LoRA's, and those sandrl's modules on
its path import when loaded (the plan reads the run config, which reaches the rollout and sandbox packages)."""
MACHINE_PROVIDES = ("torch", "numpy")
"""Left to the GPU machine's Python, with everything torch requires: its PyTorch build, and numpy, which every
PyTorch image has (its wheels are 16 MiB a Python version)."""


@dataclass(frozen=True)
class CheckSettings:
    """The model, the batches and the steps of one check."""

    hidden_size: int = 1024
    layers: int = 28
    heads: int = 16
    kv_heads: int = 8
    head_dim: int = 128
    intermediate_size: int = 3072
    vocab_size: int = 151936
    device: str = "cuda"
    micro_batch_tokens: int = 16384
    step_tokens: int = 65536
    """Tokens of each step's batch: samples of agentic lengths (``min_tokens`` to ``max_tokens``, log-uniform)."""
    min_tokens: int = 256
    max_tokens: int = 4096
    timed_steps: int = 3
    lora_rank: int = 16
    agreement_samples: int = 4
    agreement_tokens: int = 512
    peak_tflops: float = H100_BF16_TFLOPS

    def train_config(self, lora: bool = False) -> TrainConfig:
        return TrainConfig(
            lr=1e-5,
            device=self.device,
            dtype="bf16",
            activation_checkpointing=True,
            packing=True,
            micro_batch_tokens=self.micro_batch_tokens,
            lora=LoraConfig(rank=self.lora_rank, alpha=2.0 * self.lora_rank) if lora else None,
        )


TINY = CheckSettings(
    hidden_size=64,
    layers=2,
    heads=4,
    kv_heads=2,
    head_dim=16,
    intermediate_size=128,
    vocab_size=512,
    device="cpu",
    micro_batch_tokens=256,
    step_tokens=512,
    min_tokens=16,
    max_tokens=128,
    timed_steps=1,
    lora_rank=4,
    agreement_samples=2,
    agreement_tokens=32,
)
"""The same check in seconds on the CPU: its code path, not its figures."""


def write_model(settings: CheckSettings, path: Path) -> tuple[Path, int]:
    """The Qwen3 model of ``settings``, random weights (seeded), saved as a checkpoint; its parameter count."""
    import transformers

    from sandrl.inference.model import save_weights

    config = transformers.Qwen3Config(
        vocab_size=settings.vocab_size,
        hidden_size=settings.hidden_size,
        intermediate_size=settings.intermediate_size,
        num_hidden_layers=settings.layers,
        num_attention_heads=settings.heads,
        num_key_value_heads=settings.kv_heads,
        head_dim=settings.head_dim,
        max_position_embeddings=max(40960, settings.max_tokens),
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(config)
    return save_weights(model, path), sum(p.numel() for p in model.parameters())


def batches(settings: CheckSettings, count: int, *, seed: int) -> list[Batch]:
    """``count`` batches of about ``step_tokens`` random tokens each, in samples of log-uniform lengths."""
    rng = random.Random(seed)
    out = []
    for b in range(count):
        samples: list[TrainSample] = []
        total = 0
        while total < settings.step_tokens:
            length = round(math.exp(rng.uniform(math.log(settings.min_tokens), math.log(settings.max_tokens))))
            samples.append(_sample(rng, length, settings.vocab_size, f"b{b}-{len(samples)}"))
            total += length
        out.append(Batch.of(samples))
    return out


def _sample(rng: random.Random, length: int, vocab: int, group: str) -> TrainSample:
    prompt = max(1, length // 4)  # the prompt is not trained on; the rest is the model's
    return TrainSample(
        token_ids=tuple(rng.randrange(vocab) for _ in range(length)),
        loss_mask=(0,) * prompt + (1,) * (length - prompt),
        rollout_logprobs=(0.0,) * length,
        advantage=rng.choice((-1.0, 1.0)),
        group_id=group,
    )


class _Memory:
    """Peak memory of the device: the CUDA allocator's, or on the CPU this process's RSS above where it began."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")
        self.floor = 0 if self.cuda else rss_bytes(os.getpid())

    def reset(self) -> None:
        gc.collect()  # a trainer just dropped: FSDP's hooks hold its modules in cycles
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        else:
            reset_peak_rss(os.getpid())

    def peak(self) -> int:
        if self.cuda:
            torch.cuda.synchronize()
            return int(torch.cuda.max_memory_allocated())
        return rss_bytes(os.getpid(), "VmHWM") - self.floor


def run(settings: CheckSettings, *, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The whole check; the JSON line's dict."""
    import torch.distributed as dist

    from sandrl.inference.model import load_model
    from sandrl.train.ranks import RankSpec, start_rank
    from sandrl.train.trainer import Trainer

    started = time.monotonic()
    cuda = settings.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise SystemExit("gpu_check: this torch sees no CUDA device; run it on a GPU machine, or pass --tiny")
    memory = _Memory(settings.device)
    out: dict[str, Any] = {"check": "gpu", "device": _device_name(settings.device), "torch": torch.__version__}
    with tempfile.TemporaryDirectory(prefix="sandrl-gpu-check-") as tmp:
        model_dir, parameters = write_model(settings, Path(tmp) / "model")
        train_batches = batches(settings, 1 + settings.timed_steps, seed=1)
        agreement = _agreement_samples(settings)
        spec = RankSpec(str(model_dir), settings.train_config())
        trainer = start_rank(0, 1, f"file://{tmp}/store", spec, loopback=True)
        if not cuda:
            torch.set_num_threads(1)  # --tiny: threads waiting at barriers on a busy host cost more than they compute
        try:
            attention = _attention(trainer)
            out["model"] = {**_shape(settings), "parameters": parameters, "attention": attention}
            log(f"gpu_check: {parameters / 1e6:.0f}M parameters, {attention} attention, on {out['device']}")
            on_device = trainer.logprobs(agreement)  # bf16 on the device, before any update
            shape = model_shape(str(model_dir))  # what the plan reads: the checkpoint's config.json
            out["full"] = _train(trainer, shape, train_batches, settings, parameters, memory, log, "full")
            del trainer
            lora_model, tokenizer, _ = load_model(str(model_dir))
            trainer = Trainer(lora_model, settings.train_config(lora=True), tokenizer=tokenizer)
            out["lora"] = _train(trainer, shape, train_batches, settings, parameters, memory, log, "lora")
            del trainer
        finally:
            dist.destroy_process_group()
        reference, _, _ = load_model(str(model_dir))  # float32, on the CPU
        out["agreement"] = _agreement(reference, agreement, on_device)
    out["lora_vs_full_peak"] = round(out["lora"]["peak_bytes"] / out["full"]["peak_bytes"], 4)
    out["goal_mfu"] = GOAL_MFU
    out["met_mfu"] = out["full"]["mfu"] >= GOAL_MFU
    out["settings"] = dataclasses.asdict(settings)
    out["duration_s"] = round(time.monotonic() - started, 1)
    return out


def _train(
    trainer: Any,
    shape: ModelShape,
    train_batches: list[Batch],
    settings: CheckSettings,
    parameters: int,
    memory: _Memory,
    log: Callable[[str], None],
    name: str,
) -> dict[str, Any]:
    """One untimed step, then the timed ones: throughput and the peak against the plan."""
    from sandrl.train.plan import plan_memory

    memory.reset()
    first = trainer.step(train_batches[0])
    _sync(settings.device)
    started = time.perf_counter()
    tokens, padding = 0, []
    for batch in train_batches[1:]:
        metrics = trainer.step(batch)
        tokens += sum(s.num_tokens for s in batch.samples)
        padding.append(metrics["padding_frac"])
    _sync(settings.device)
    elapsed = time.perf_counter() - started
    peak = memory.peak()
    rate = tokens / elapsed
    mfu = 6 * parameters * rate / (settings.peak_tflops * 1e12)
    longest = max(s.num_tokens for b in train_batches for s in b.samples)
    plan = plan_memory(
        shape,
        trainer.config,
        device_memory=_device_memory(settings.device),
        longest_sample=longest,
        flash_attention=_attention(trainer).startswith("flash"),
    )
    log(f"  {name}: {rate:,.0f} tokens/s, MFU {mfu:.1%}, peak {_gib(peak)} (plan {_gib(plan.total)})")
    return {
        "tokens_per_s": round(rate, 1),
        "mfu": float(f"{mfu:.4g}"),
        "step_s": round(elapsed / max(len(train_batches) - 1, 1), 3),
        "tokens_per_step": tokens // max(len(train_batches) - 1, 1),
        "padding_frac": round(sum(padding) / max(len(padding), 1), 4),
        "grad_norm_first": first["grad_norm"],
        "peak_bytes": peak,
        "plan_bytes": plan.total,
        "peak_vs_plan": round(peak / plan.total, 4) if plan.total else None,
        "plan_terms": {t.name: t.bytes for t in plan.terms},
    }


def _agreement_samples(settings: CheckSettings) -> list[TrainSample]:
    rng = random.Random(7)
    return [
        _sample(rng, settings.agreement_tokens, settings.vocab_size, "a") for _ in range(settings.agreement_samples)
    ]


def _agreement(reference: Any, samples: list[TrainSample], on_device: list[list[float]]) -> dict[str, Any]:
    """Each token's log-prob from ``reference`` in float32 on the CPU, one sample at a time, against ``on_device``."""
    from sandrl.train.logprobs import PolicyForward

    policy = PolicyForward(reference.float().eval())
    worst = total = spread = 0.0
    count = 0
    with torch.no_grad():
        for sample, device_row in zip(samples, on_device, strict=True):
            ids = torch.tensor([sample.token_ids])
            cpu_row = policy(ids, chunk_tokens=1024).logprobs[0, 1:]
            diff = (cpu_row - torch.tensor(device_row[1:])).abs()
            worst = max(worst, float(diff.max()))
            total += float(diff.sum())
            spread += float(cpu_row.std())
            count += diff.numel()
    return {
        "tokens": count,
        "max_abs_diff": round(worst, 5),
        "mean_abs_diff": round(total / count, 5),
        # The spread of the float32 log-probs within a sample: the scale the differences are small against.
        "fp32_logprob_std": round(spread / len(samples), 5),
        "dtype_device": "bfloat16",
        "dtype_cpu": "float32",
    }


def _attention(trainer: Any) -> str:
    """The attention kernel the trainer's model runs (``sdpa``, ``flash_attention_2``...): packing depends on it."""
    return str(getattr(trainer.policy.lm.config, "_attn_implementation", None) or "eager")


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB"


def _shape(settings: CheckSettings) -> dict[str, int]:
    names = ("hidden_size", "layers", "heads", "kv_heads", "head_dim", "intermediate_size", "vocab_size")
    return {n: getattr(settings, n) for n in names}


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        return str(torch.cuda.get_device_name(torch.device(device)))
    return f"cpu ({os.cpu_count()} cores)"


def _device_memory(device: str) -> int:
    if device.startswith("cuda"):
        return int(torch.cuda.get_device_properties(torch.device(device)).total_memory)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def requirements() -> list[str]:
    """``name==version`` of every distribution the check needs besides what the GPU machine provides, as
    installed here: :data:`CHECK_IMPORTS` and what they require, less :data:`MACHINE_PROVIDES` and theirs.
    ``scripts/gpu-check.sh wheels`` downloads their wheels, so a machine without an index can install them."""
    import re
    from importlib import metadata

    from packaging.requirements import Requirement

    def canonical(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    def closure(roots: tuple[str, ...]) -> dict[str, str]:
        found: dict[str, str] = {}
        todo = [canonical(r) for r in roots]
        while todo:
            name = todo.pop()
            if name in found:
                continue
            try:
                dist = metadata.distribution(name)
            except metadata.PackageNotFoundError:
                continue  # optional here: an extra's, or another platform's
            found[name] = dist.version
            for text in dist.requires or ():
                requirement = Requirement(text)
                if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                    todo.append(canonical(requirement.name))
        return found

    provided = closure(MACHINE_PROVIDES)
    return sorted(f"{name}=={version}" for name, version in closure(CHECK_IMPORTS).items() if name not in provided)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandrl.bench.gpu_check", description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="a small model on the CPU: the code path, in seconds")
    parser.add_argument("--peak-tflops", type=float, default=H100_BF16_TFLOPS, help="the GPU's dense bf16 peak")
    parser.add_argument("--timed-steps", type=int, default=None, help="steps timed after the first (default 3)")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON line to this file")
    parser.add_argument(
        "--requirements", action="store_true", help="print the pinned distributions it needs besides torch, and exit"
    )
    args = parser.parse_args(argv)
    if args.requirements:
        print("\n".join(requirements()))
        return 0
    settings = dataclasses.replace(TINY if args.tiny else CheckSettings(), peak_tflops=args.peak_tflops)
    if args.timed_steps is not None:
        if args.timed_steps < 1:
            parser.error("--timed-steps must be at least 1")
        settings = dataclasses.replace(settings, timed_steps=args.timed_steps)
    result = run(settings, log=lambda line: print(line, file=sys.stderr, flush=True))
    line = json.dumps(result)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(line + "\n")
    print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
