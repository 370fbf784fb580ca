"""``sandrl bench train --scale``: what the trainer's scale features save, measured on the CPU.

One model for the first three rows: a Qwen3-architecture model of about 55M parameters (12
decoder layers of width 640, the byte tokenizer's vocabulary), random weights, written to a
temporary directory and loaded the way ``sandrl train`` loads a checkpoint. Its parameters sit in
its decoder layers, as a 7B model's do (a small model with a 152k vocabulary would be mostly
embedding). One ``[train]`` table (:meth:`ScaleSettings.run_config`) trains it in every row.

- **ranks**: the peak resident memory of each of 2 gloo ranks (:class:`~sandrl.train.ranks.RankGroup`,
  FSDP2) over one training step, against the trainer alone in one process, same batch. Each
  process's high-water mark is reset after a first step (which made the optimizer state) and read
  after the measured one; the same measure of a process holding a model of a few thousand
  parameters is subtracted (Python, torch and gloo themselves), so what remains is the
  parameters, gradients, optimizer state, activations and buffers the step held. Every process
  maps large blocks on their own (:func:`_freed_memory_returned`), so that its RSS is what it holds,
  not what glibc kept of what it freed.
- **lora**: bytes of the trainable parameters and of AdamW's state after a step, LoRA rank 16 on
  every linear layer of the decoder (``[train.lora]``, through ``peft``) against full fine-tuning.
- **bf16**: bytes of the parameters every decoder layer's forward sees (read in a forward pre-hook,
  after FSDP2 has gathered them), ``dtype = "bf16"`` (FSDP2's ``MixedPrecisionPolicy``, in a group
  of one rank) against fp32.
- **packing**: the share of forwarded positions that are padding, packed against padded, on the
  demo's episodes: each of its training tasks' prompt with its reference reply, as its tiny model
  sees them, in batches of ``groups_per_step x group_size`` at its ``micro_batch_tokens``, laid out
  by the trainer's :mod:`~sandrl.train.micro_batches` in rows as wide as a trainer of the demo's
  model makes them (the whole budget: it attends per sample through
  :mod:`~sandrl.train.packed_attention`), and, reported beside, in the ``3 x hidden_size`` rows of
  a model that attends over a whole row with a mask.
- **log-probs**: the peak bytes of the tensors made by the chunked log-probs of 8192 tokens with a
  152064-token head (forward with the entropy, as the trainer's training forward asks, and
  backward), against the same computation on the full logits, counted by
  :class:`~sandrl.bench.tensor_peak.TensorPeak` on ``meta`` tensors (the full computation holds
  about 19 GiB at once; the count is the same as on real tensors).

Prints a card, then returns the JSON line's dict; ``met`` says whether every target was.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from rich.console import Console
from rich.table import Table
from rich.text import Text

from sandrl.bench.tensor_peak import TensorPeak, reset_peak_rss, rss_bytes
from sandrl.inference.model import build_tiny_model, load_model, save_weights
from sandrl.inference.tiny_config import TinyModelConfig
from sandrl.inference.tokenizer import TINY, ByteTokenizer
from sandrl.train import micro_batches
from sandrl.train.batch import Batch, TrainSample
from sandrl.train.config import TrainConfig
from sandrl.train.lora_config import LoraConfig
from sandrl.train.ranks import RankGroup, RankSpec, start_rank
from sandrl.train.run_config import RunConfig
from sandrl.train.trainer import Trainer

TARGETS = {"ranks": 0.65, "lora": 0.05, "bf16": 0.55, "packing": 0.05, "logprobs": 0.1}
"""Each row's bound (issue #39): the ratio to its baseline, or for packing the padding's share."""

BASELINE_MODEL = TinyModelConfig(
    architecture="qwen3", hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=32
)
"""The stand-in whose processes measure what a rank or a trainer holds besides its model."""


@dataclass(frozen=True)
class ScaleSettings:
    """What every row measures; the defaults take about two minutes on 2 busy cores."""

    model: TinyModelConfig = field(
        default_factory=lambda: TinyModelConfig(
            architecture="qwen3",
            hidden_size=640,
            num_layers=12,
            num_heads=10,
            num_kv_heads=5,
            intermediate_size=1728,
            max_position_embeddings=4096,
        )
    )
    samples: int = 2
    """Samples of the measured step: each rank forwards one micro-batch, the trainer alone all of them."""
    sample_tokens: int = 512
    micro_batch_tokens: int = 512
    lora_rank: int = 16
    logprob_tokens: int = 8192
    logprob_vocab: int = 152064
    """Qwen2.5's and Qwen3's vocabulary."""
    logprob_hidden: int = 64
    """The hidden states' width: the logits' bytes do not depend on it, and the row stays fast."""
    logprob_chunk_tokens: int = TrainConfig.logprob_chunk_tokens
    """The trainer's default."""
    demo_tasks: int | None = None
    """The demo's training tasks to lay out (None: all of them)."""

    def run_config(self) -> TrainConfig:
        """The [train] table of every row: fp32, packed, activation checkpointing, one process."""
        return TrainConfig(
            lr=1e-4,
            micro_batch_tokens=self.micro_batch_tokens,
            activation_checkpointing=True,
            logprob_chunk_tokens=self.logprob_chunk_tokens,
        )


QUICK = ScaleSettings(
    model=TinyModelConfig(
        architecture="qwen3", hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=768
    ),
    sample_tokens=64,
    micro_batch_tokens=64,
    logprob_tokens=512,
    logprob_vocab=4096,
    logprob_hidden=16,
    logprob_chunk_tokens=64,
    demo_tasks=16,
)
"""A run of seconds (the test's): every row's shape, not the ratios the targets are about. Its model
(3M parameters) is large enough for 2 ranks to hold clearly less than 1 process."""


def run(settings: ScaleSettings, demo: RunConfig, *, console: Console | None = None) -> dict[str, Any]:
    """Every row on ``settings``; ``demo`` is the demo's run config (its tasks, episodes and budget)."""
    console = console or Console(stderr=True)
    started = time.monotonic()
    config = settings.run_config()
    with tempfile.TemporaryDirectory(prefix="sandrl-bench-scale-") as tmp:
        root = Path(tmp)
        model_dir, parameters = _write_model(settings.model, root / "model")
        baseline_dir, _ = _write_model(BASELINE_MODEL, root / "baseline")
        warm, measured = _batch(2, 16, seed=1), _batch(settings.samples, settings.sample_tokens, seed=2)
        console.print(
            f"bench train --scale: a {parameters / 1e6:.1f}M-parameter Qwen3 model; "
            f"{settings.samples} x {settings.sample_tokens} tokens per measured step"
        )
        with _freed_memory_returned(), _fresh_process() as pool:
            # The trainer alone, then LoRA and bf16, in one process while the ranks run in theirs.
            solo = pool.submit(_solo, str(model_dir), str(baseline_dir), config, warm, measured, settings.lora_rank)
            console.print("  2 gloo ranks ...")
            ranks = [_ranks_peak(str(d), config, warm, measured) for d in (model_dir, baseline_dir)]
            console.print("  the trainer alone, LoRA and bf16 ...")
            probed = solo.result(timeout=1800)
        ranks_row = _ranks_row(probed["alone_bytes"], [a - b for a, b in zip(*ranks, strict=True)])
        console.print("  packing and log-probs ...")
        packing = packing_row(demo, root / "demo", settings.demo_tasks)
    out: dict[str, Any] = {
        "bench": "train_scale",
        "cpus": os.cpu_count(),
        "model": {**dataclasses.asdict(settings.model), "parameters": parameters},
        "settings": {k: v for k, v in dataclasses.asdict(settings).items() if k != "model"},
        "ranks": {**ranks_row, "malloc_mmap_threshold": MMAP_THRESHOLD},
        "lora": _lora_row(probed["full_state_bytes"], probed["lora_state_bytes"], probed, settings.lora_rank),
        "bf16": _bf16_row(probed["fp32_layer_bytes"], probed["bf16_layer_bytes"], probed["bf16_dtypes"]),
        "packing": packing,
        "logprobs": logprob_row(settings),
    }
    out["met"] = all(out[name]["met"] for name in TARGETS)
    out["duration_s"] = round(time.monotonic() - started, 1)
    console.print(render_card(out))
    return out


# -- the rows ------------------------------------------------------------------------------------------


def _ratio_row(value: float, baseline: float, name: str, **extra: Any) -> dict[str, Any]:
    ratio = value / baseline if baseline > 0 else float("nan")
    return {**extra, "ratio": round(ratio, 4), "target": TARGETS[name], "met": 0 < ratio <= TARGETS[name]}


def _ranks_row(alone: int, per_rank: list[int]) -> dict[str, Any]:
    return _ratio_row(max(per_rank), alone, "ranks", alone_bytes=alone, per_rank_bytes=per_rank, ranks=len(per_rank))


def _lora_row(full: int, lora: int, probed: dict[str, Any], rank: int) -> dict[str, Any]:
    return _ratio_row(
        lora,
        full,
        "lora",
        full_bytes=full,
        lora_bytes=lora,
        rank=rank,
        full_trainable=probed["full_trainable"],
        lora_trainable=probed["lora_trainable"],
    )


def _bf16_row(fp32: int, bf16: int, dtypes: list[str]) -> dict[str, Any]:
    return _ratio_row(bf16, fp32, "bf16", fp32_bytes=fp32, bf16_bytes=bf16, bf16_dtypes=dtypes)


def packing_row(demo: RunConfig, root: Path, tasks: int | None = None) -> dict[str, Any]:
    """Padding's share of the positions forwarded, packed and padded, on the demo's episodes (see the module).

    Packed rows are as wide as a trainer of the demo's model makes them (its attention decides: the
    budget when it attends per sample); ``packed_masked_waste`` is the same in the ``3 x hidden_size``
    rows of a model that attends over a whole row with a mask.
    """
    if demo.model.name != TINY:
        raise ValueError(f"the demo's model is {TINY!r}, built with [warm_start.tiny]; got {demo.model.name!r}")
    samples = demo_episodes(demo, root, tasks)
    batch = demo.run.groups_per_step * demo.rollout.group_size
    budget = demo.train.micro_batch_tokens
    model, tokenizer = build_tiny_model(demo.warm_start.tiny)
    trainer = Trainer(model, dataclasses.replace(demo.train, packing=True), tokenizer=tokenizer)
    row, attention = trainer.row_tokens, str(trainer.policy.base.config._attn_implementation)
    masked_row = micro_batches.row_tokens(budget, hidden_size=demo.warm_start.tiny.hidden_size, varlen=False)
    layouts = {"packed": (True, row), "padded": (False, 0), "packed_masked": (True, masked_row)}
    waste: dict[str, float] = {}
    count: dict[str, int] = {}
    for name, (packing, width) in layouts.items():
        slots = tokens = 0
        for start in range(0, len(samples), batch):
            part = samples[start : start + batch]
            for plan in micro_batches.plan([s.num_tokens for s in part], budget, packing=packing, row_tokens=width):
                mb = micro_batches.collate(part, plan, pad_id=0, packing=packing, row_tokens=width)
                slots, tokens, count[name] = slots + mb.slots, tokens + mb.tokens, count.get(name, 0) + 1
        waste[name] = round(1 - tokens / slots, 4)
    lengths = sorted(s.num_tokens for s in samples)
    return {
        "packed_waste": waste["packed"],
        "padded_waste": waste["padded"],
        "packed_masked_waste": waste["packed_masked"],
        "packed_attention": attention,
        "packed_masked_row_tokens": masked_row,
        "packed_micro_batches": count["packed"],
        "padded_micro_batches": count["padded"],
        "packed_row_tokens": row,
        "episodes": len(samples),
        "batch": batch,
        "micro_batch_tokens": budget,
        "model_hidden_size": demo.warm_start.tiny.hidden_size,
        "tokens_min": lengths[0],
        "tokens_median": lengths[len(lengths) // 2],
        "tokens_max": lengths[-1],
        "target": TARGETS["packing"],
        "met": waste["packed"] <= TARGETS["packing"],
    }


def demo_episodes(demo: RunConfig, root: Path, tasks: int | None = None) -> list[TrainSample]:
    """Each of ``demo``'s training tasks (the first ``tasks``) as its reference episode, as the tiny model sees it."""
    from sandrl.rollout.agents.formats import AgentFormat
    from sandrl.tasks.builtin.generated import generate_tasks
    from sandrl.train.warmstart import demonstrations
    from sandrl.wiring import load_task_set

    family = demo.tasks.family
    if not family:
        raise ValueError("the demo's run config names no generated task family")
    count = demo.tasks.count if tasks is None else min(tasks, demo.tasks.count)
    generate_tasks(root, family, count, demo.tasks.seed, overwrite=True)
    rollout = demo.rollout
    agent_format = cast(AgentFormat, rollout.format)
    tasks_loaded = load_task_set(root)
    return demonstrations(tasks_loaded, ByteTokenizer(), rollout.system_prompt, agent_format, rollout.tool_names())


def logprob_row(settings: ScaleSettings) -> dict[str, Any]:
    """The chunked log-probs' peak against the full logits' (see the module)."""
    chunked = logprob_peak(settings, chunked=True)
    full = logprob_peak(settings, chunked=False)
    logits = (settings.logprob_tokens - 1) * settings.logprob_vocab * 4
    return _ratio_row(
        chunked,
        full,
        "logprobs",
        chunked_bytes=chunked,
        full_bytes=full,
        logits_bytes=logits,
        tokens=settings.logprob_tokens,
        vocab=settings.logprob_vocab,
        chunk_tokens=settings.logprob_chunk_tokens,
    )


def logprob_peak(settings: ScaleSettings, *, chunked: bool, device: str = "meta") -> int:
    """Peak bytes of the log-probs (and entropy) of random hidden states, forward and backward."""
    import transformers

    from sandrl.train.logprobs import PolicyForward

    config = transformers.Qwen3Config(
        vocab_size=settings.logprob_vocab,
        hidden_size=settings.logprob_hidden,
        intermediate_size=8,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=8,
        tie_word_embeddings=True,
    )
    with torch.device(device):
        policy = PolicyForward(transformers.Qwen3ForCausalLM(config))
        hidden = torch.randn(1, settings.logprob_tokens, settings.logprob_hidden, requires_grad=True)
        ids = torch.randint(0, settings.logprob_vocab, (1, settings.logprob_tokens))
    weight = policy.head.weight
    with TensorPeak() as peak:
        if chunked:
            out = policy.token_logprobs(hidden, ids, chunk_tokens=settings.logprob_chunk_tokens, entropy=True)
            logprobs = out.logprobs
        else:  # the trainer before chunking: the model's full logits, then their log-softmax
            logits = hidden[:, :-1].float() @ weight.float().t()
            logprobs = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
            with torch.no_grad():
                probs = torch.softmax(logits, -1)
                entropy = torch.logsumexp(logits, -1) - (probs * logits).sum(-1)
            del logits, probs, entropy
        torch.autograd.backward(logprobs.sum())
        del logprobs
    return int(peak.peak)


# -- measured in other processes -------------------------------------------------------------------


def _write_model(tiny: TinyModelConfig, path: Path) -> tuple[Path, int]:
    model, tokenizer = build_tiny_model(tiny)
    return save_weights(model, path, tokenizer), sum(p.numel() for p in model.parameters())


def _batch(count: int, length: int, *, seed: int) -> Batch:
    """``count`` samples of ``length`` random byte tokens, all but the first trained, advantages +-1."""
    generator = torch.Generator().manual_seed(seed)
    return Batch.of(
        TrainSample(
            token_ids=tuple(torch.randint(0, 256, (length,), generator=generator).tolist()),
            loss_mask=(0, *([1] * (length - 1))),
            rollout_logprobs=(0.0,) * length,
            advantage=1.0 if i % 2 else -1.0,
            group_id="g",
        )
        for i in range(count)
    )


MMAP_THRESHOLD = 65536
"""Blocks from this size up are mapped on their own, and unmapped when freed (``mallopt(M_MMAP_THRESHOLD)``)."""


@contextlib.contextmanager
def _freed_memory_returned() -> Iterator[None]:
    """Processes started inside give freed blocks back to the system, so their RSS is what is alive.

    With glibc's default (a threshold that rises to the largest block freed, up to 32 MiB), the
    gathered layers and reduced gradients FSDP2 frees at every layer stay in a rank's heap: its RSS
    then kept about 400 MiB more than it held, and 2 ranks looked no smaller than 1 process.
    """
    old = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLD)
    try:
        yield
    finally:
        if old is None:
            del os.environ["MALLOC_MMAP_THRESHOLD_"]
        else:
            os.environ["MALLOC_MMAP_THRESHOLD_"] = old


@contextlib.contextmanager
def _fresh_process() -> Iterator[ProcessPoolExecutor]:
    """A process of its own for a job (spawned: torch's threads are not forked)."""
    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), max_tasks_per_child=1)
    try:
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _ranks_peak(model_dir: str, config: TrainConfig, warm: Batch, measured: Batch) -> list[int]:
    """Each of 2 ranks' peak RSS over the measured step (after a first step made the optimizer state)."""
    with RankGroup(RankSpec(model_dir, dataclasses.replace(config, processes=2))) as group:
        group.step(warm)
        for pid in group.pids:
            reset_peak_rss(pid)
        group.step(measured)
        return [rss_bytes(pid, "VmHWM") for pid in group.pids]


def _solo(
    model_dir: str, baseline_dir: str, config: TrainConfig, warm: Batch, measured: Batch, lora_rank: int
) -> dict[str, Any]:
    """In this (fresh) process: the trainer alone (its peak, less the stand-in's), then the LoRA and bf16 rows."""
    # One thread, as each of 2 ranks has on 2 cores: threads waiting at a barrier on a busy host cost
    # more than they compute at this size.
    torch.set_num_threads(1)
    baseline = _alone_peak(baseline_dir, config, warm, measured)
    return {"alone_bytes": _alone_peak(model_dir, config, warm, measured) - baseline} | _probe(
        model_dir, config, warm, lora_rank
    )


def _alone_peak(model_dir: str, config: TrainConfig, warm: Batch, measured: Batch) -> int:
    """The trainer alone in this process: its peak RSS over the measured step, as for the ranks."""
    trainer = _trainer(model_dir, config)
    trainer.step(warm)
    reset_peak_rss(os.getpid())
    trainer.step(measured)
    return rss_bytes(os.getpid(), "VmHWM")


def _probe(model_dir: str, config: TrainConfig, batch: Batch, lora_rank: int) -> dict[str, Any]:
    """Full and LoRA trainable state after a step; the parameters the decoder layers compute with, fp32
    alone, then bf16 as a rank of a group of one (FSDP2)."""
    import torch.distributed as dist

    out: dict[str, Any] = {}
    full = _trainer(model_dir, config)
    seen = _watch_layers(full)
    full.step(batch)
    out["fp32_layer_bytes"] = sum(b for b, _ in seen.values())
    out["full_state_bytes"] = trainable_state_bytes(full.optimizer)
    out["full_trainable"] = _trainable(full.optimizer)
    del full, seen
    lora = _trainer(model_dir, dataclasses.replace(config, lora=LoraConfig(rank=lora_rank, alpha=2.0 * lora_rank)))
    lora.step(batch)
    out["lora_state_bytes"] = trainable_state_bytes(lora.optimizer)
    out["lora_trainable"] = _trainable(lora.optimizer)
    del lora
    with tempfile.TemporaryDirectory(prefix="sandrl-bench-store-") as store:
        spec = RankSpec(model_dir, dataclasses.replace(config, dtype="bf16"))
        bf16 = start_rank(0, 1, f"file://{store}/store", spec, loopback=True)  # what a bf16 run's rank builds
        torch.set_num_threads(1)
        try:
            seen = _watch_layers(bf16)
            bf16.step(batch)
            out["bf16_layer_bytes"] = sum(b for b, _ in seen.values())
            out["bf16_dtypes"] = sorted({d for _, dtypes in seen.values() for d in dtypes})
        finally:
            dist.destroy_process_group()
    return out


def _trainer(model_dir: str, config: TrainConfig) -> Trainer:
    model, tokenizer, _ = load_model(model_dir)
    return Trainer(model, config, tokenizer=tokenizer)


def _watch_layers(trainer: Trainer) -> dict[int, tuple[int, list[str]]]:
    """Per decoder layer, the bytes and dtypes of its parameters as its first forward sees them."""
    from sandrl.train.sharding import decoder_layers

    seen: dict[int, tuple[int, list[str]]] = {}
    for index, layer in enumerate(decoder_layers(trainer.policy)):

        def record(module: torch.nn.Module, args: Any, index: int = index) -> None:
            if index not in seen:
                params = list(module.parameters())
                dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in params})
                seen[index] = (sum(p.numel() * p.element_size() for p in params), dtypes)

        # Registered after FSDP2's own pre-hook: it runs once the layer's parameters are gathered.
        layer.register_forward_pre_hook(record)
    return seen


def trainable_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the optimizer's parameters and of its state (AdamW's moments), this process's shards."""
    total = 0
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state.get(param, {}).values()
            total += _local_bytes(param) + sum(_local_bytes(v) for v in state if isinstance(v, torch.Tensor))
    return total


def _trainable(optimizer: torch.optim.Optimizer) -> int:
    return sum(p.numel() for group in optimizer.param_groups for p in group["params"])


def _local_bytes(tensor: torch.Tensor) -> int:
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return int(local.numel() * local.element_size())


# -- the card --------------------------------------------------------------------------------------


def _size(nbytes: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes:.0f} B"


def render_card(result: dict[str, Any]) -> Table:
    model = result["model"]
    table = Table(
        title=f"train --scale: a {model['parameters'] / 1e6:.1f}M-parameter Qwen3 model ({result['cpus']} CPUs)"
    )
    for name, justify in (("", "left"), ("measured", "right"), ("against", "right"), ("value", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    table.add_column("target", justify="right")
    table.add_column("met")
    r, lo, bf, pk, lp = (result[k] for k in ("ranks", "lora", "bf16", "packing", "logprobs"))
    rows = (
        (
            f"peak per rank, {r['ranks']} ranks vs 1 process",
            _size(max(r["per_rank_bytes"])),
            _size(r["alone_bytes"]),
            f"{r['ratio']:.3f}x",
            f"<= {r['target']}x",
            r["met"],
        ),
        (
            f"trainable + AdamW, LoRA r{lo['rank']} vs full",
            _size(lo["lora_bytes"]),
            _size(lo["full_bytes"]),
            f"{lo['ratio']:.4f}x",
            f"<= {lo['target']}x",
            lo["met"],
        ),
        (
            "layer parameters computed with, bf16 vs fp32",
            _size(bf["bf16_bytes"]),
            _size(bf["fp32_bytes"]),
            f"{bf['ratio']:.3f}x",
            f"<= {bf['target']}x",
            bf["met"],
        ),
        (
            f"padding, packed in {pk['packed_row_tokens']}-token rows vs padded ({pk['episodes']} demo episodes; "
            f"{pk['packed_masked_row_tokens']}-token masked rows: {pk['packed_masked_waste']:.1%})",
            f"{pk['packed_waste']:.1%}",
            f"{pk['padded_waste']:.1%}",
            f"{pk['packed_waste']:.1%}",
            f"<= {pk['target']:.0%}",
            pk["met"],
        ),
        (
            f"log-prob peak, {lp['tokens']} x {lp['vocab']}, chunk {lp['chunk_tokens']}",
            _size(lp["chunked_bytes"]),
            _size(lp["full_bytes"]),
            f"{lp['ratio']:.3f}x",
            f"<= {lp['target']}x",
            lp["met"],
        ),
    )
    for label, measured, against, value, target, met in rows:
        table.add_row(*(Text(str(c)) for c in (label, measured, against, value, target, "yes" if met else "NO")))
    table.caption = f"{'all targets met' if result['met'] else 'a target was missed'}; {result['duration_s']} s"
    return table
