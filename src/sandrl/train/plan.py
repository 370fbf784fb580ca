"""The memory a training run will take on each device, from its config alone, before anything starts.

``sandrl train CONFIG --plan`` prints it; ``sandrl train`` checks it first and refuses, in one
line naming the fix, a run whose trainer will not fit (:func:`check_fits`). Nothing is loaded:
the model is counted on the ``meta`` device (:mod:`sandrl.train.model_shape`), so a 7B run on
eight GPUs is planned on a laptop (``--device-memory 80GiB`` where no GPU is at hand).

Per device (one rank per GPU; on CPU every rank shares the host, so the host's total is the
ranks' sum), with ``N = processes``:

- **parameters**: the float32 parameters (FSDP2 shards them 1/N; with bf16 they stay float32, the
  optimizer's master copy), plus, when they are sharded or cast, the units gathered for compute
  in the compute dtype: the root (embeddings, final norm, head), kept from the forward to the
  backward, and two decoder layers (the one running and the one prefetched).
- **gradients**: float32 gradients of the trainable parameters (1/N), plus the gathered units'
  unsharded gradients while they wait to be reduced. LoRA: the adapters' only.
- **optimizer state**: AdamW's two float32 moments per trainable parameter (1/N); in host memory
  with ``offload_optimizer`` (FSDP2's ``CPUOffloadPolicy`` moves the shards there too).
- **activations** at the token budget one rank forwards (``micro_batch_tokens``, or the longest
  sample, which is forwarded alone): what the model saves per token and decoder layer for the
  backward, counted from its modules (:func:`layer_activation_bytes`), one layer more for the
  gradients of the layer whose backward runs; with activation checkpointing, each layer's input
  plus one layer recomputed. Packed rows attend per sample without a mask (flash-attention's
  varlen kernel, or :mod:`~sandrl.train.packed_attention`); padded rows attend through SDPA with a
  row x row mask, which every layer keeps (except with flash-attention on a GPU).
- **log-prob buffers**: ``logprob_chunk_tokens x vocab`` float32 logits, four times (the logits,
  logsumexp's exponentials, their gradient and the picked token's gradient), plus, in bf16, the
  head's weight (and gradient) in float32.
- **reference**: none with ``loss.beta = 0`` or with LoRA (the base with its adapters off); else
  a frozen float32 copy of the parameters (1/N).

Checked against measurements (``tests/train/test_plan*.py``): the peak of real CPU training steps
(fp32 in one process; two FSDP2 ranks over gloo with a sharded reference; bf16 through FSDP2's
mixed precision with LoRA and checkpointing: within 10% a rank), and what autograd keeps for one
decoder layer (fp32 and bf16, full and LoRA, packed or not: within 10%). On GPUs the CUDA caching
allocator, NCCL's buffers and the attention kernels add what :data:`GPU_RESERVE` stands for; that
part has not been measured here.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sandrl.errors import ConfigError
from sandrl.train.config import TrainConfig
from sandrl.train.lora_config import LoraConfig
from sandrl.train.model_shape import ModelShape, UnknownArchitecture, model_shape
from sandrl.train.run_config import RunConfig

ADAM_BYTES = 8
"""AdamW's first and second moments, float32, per trainable parameter."""
LOGPROB_BUFFERS = 4
"""Chunk x vocab float32 buffers alive at once in a chunk's backward (measured: 3.6 to 4)."""
GATHERED_LAYERS = 2
"""Decoder layers gathered at once under FSDP2: the one computing and the one prefetched."""
GPU_RESERVE = 0.10
"""A GPU's memory the plan leaves to the CUDA context, NCCL's buffers and the allocator's fragmentation."""
MAX_PROCESSES = 1024
"""The most ranks a suggestion names."""
_SETTINGS = ("processes", "lora", "activation_checkpointing", "micro_batch_tokens", "offload_optimizer")


@dataclass(frozen=True)
class Term:
    """One line of the plan: bytes per rank, and how they were counted."""

    name: str
    bytes: int
    how: str


@dataclass(frozen=True)
class Change:
    """A setting that shrinks the plan, the value to give it, and what the plan totals then."""

    setting: str
    """``processes``, ``lora``, ``activation_checkpointing``, ``micro_batch_tokens`` or ``offload_optimizer``."""
    value: Any
    total: int
    fits: bool

    def describe(self) -> str:
        if self.setting == "lora":
            return f"[train.lora] rank = {self.value.rank}"
        value = str(self.value).lower() if isinstance(self.value, bool) else str(self.value)
        text = f"[train] {self.setting} = {value}"
        return f"{text} (--nproc {self.value})" if self.setting == "processes" else text


@dataclass(frozen=True)
class MemoryPlan:
    """What one device holds at the trainer's peak, against its memory."""

    model: str
    parameters: int
    trainable: int
    device: str
    processes: int
    ranks_per_device: int
    """Ranks that share one device's memory: all of them on CPU, one per GPU."""
    tokens: int
    """Tokens one rank forwards at once (the activations' budget)."""
    terms: tuple[Term, ...]
    host_offload: int
    """Bytes per rank ``offload_optimizer`` keeps in host memory instead."""
    device_memory: int
    memory_source: str
    usable: int
    """``device_memory`` less what the plan leaves free (:data:`GPU_RESERVE` on a GPU)."""
    changes: tuple[Change, ...] = ()
    """When it does not fit: each setting that shrinks it, most effective first."""
    together: tuple[Change, ...] = ()
    """When no single change fits: the changes that fit together, applied in order."""

    @property
    def per_rank(self) -> int:
        return sum(t.bytes for t in self.terms)

    @property
    def total(self) -> int:
        return self.per_rank * self.ranks_per_device

    @property
    def fits(self) -> bool:
        return self.total <= self.usable

    def term(self, name: str) -> int:
        return next(t.bytes for t in self.terms if t.name == name)

    def fix(self) -> str:
        """The settings that make it fit, as one clause."""
        alone = [c for c in self.changes if c.fits]
        if alone:
            return "set " + " or ".join(f"{c.describe()} ({human_bytes(c.total)})" for c in alone)
        if self.together:
            return (
                "set together "
                + ", ".join(c.describe() for c in self.together)
                + f" ({human_bytes(self.together[-1].total)})"
            )
        return "no setting of [train] makes it fit: a device with more memory, more of them, or a smaller model"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary; memory in bytes (``*_bytes``)."""
        return {
            "model": self.model,
            "parameters": self.parameters,
            "trainable": self.trainable,
            "device": self.device,
            "processes": self.processes,
            "tokens": self.tokens,
            **{f"{t.name.replace(' ', '_').replace('-', '_')}_bytes": t.bytes for t in self.terms},
            "per_rank_bytes": self.per_rank,
            "total_bytes": self.total,
            "device_memory_bytes": self.device_memory,
            "usable_bytes": self.usable,
            "host_offload_bytes": self.host_offload,
            "fits": self.fits,
            "changes": [{"setting": c.describe(), "total_bytes": c.total, "fits": c.fits} for c in self.changes],
        }


def plan_run(config: RunConfig, *, device_memory: int | None = None) -> MemoryPlan:
    """The plan of a run config's trainer; ``device_memory`` (bytes) replaces what the device reports."""
    memory, source = device_capacity(config.train.device, device_memory)
    return plan_memory(
        model_shape(config.model.name),
        config.train,
        device_memory=memory,
        memory_source=source,
        longest_sample=config.rollout.max_total_tokens,
    )


def check_fits(config: RunConfig, *, device_memory: int | None = None) -> MemoryPlan | None:
    """The plan, or a :class:`ConfigError` of one line naming the fix when the trainer will not fit.

    None for a model the plan cannot count (not a Llama/Qwen-style decoder) or a device whose memory
    this machine cannot tell (MPS, other accelerators) without ``device_memory``: the run goes ahead
    unchecked, as before the plan existed.
    """
    try:
        plan = plan_run(config, device_memory=device_memory)
    except (UnknownArchitecture, UnmeasuredDevice):
        return None
    if not plan.fits:
        needs = (
            f"{human_bytes(plan.total)} per device"
            if plan.ranks_per_device == 1
            else f"{human_bytes(plan.total)} for {plan.ranks_per_device} ranks"
        )
        source = plan.memory_source
        if plan.usable < plan.device_memory:
            source += f", less {GPU_RESERVE:.0%} for the CUDA context and fragmentation"
        raise ConfigError(
            f"the trainer needs {needs} but {plan.device} has {human_bytes(plan.usable)} usable ({source}): "
            f"{plan.fix()}; `sandrl train CONFIG --plan` shows each term"
        )
    return plan


def plan_memory(
    shape: ModelShape,
    train: TrainConfig,
    *,
    device_memory: int,
    memory_source: str = "",
    longest_sample: int = 0,
    flash_attention: bool = False,
) -> MemoryPlan:
    """The plan of ``train`` on ``shape``, with the changes that make it fit when it does not.

    ``longest_sample``: the most tokens one sample can hold (``[rollout] max_total_tokens``): it is
    forwarded alone when it is over ``micro_batch_tokens``. ``flash_attention``: the GPU ranks
    attend with flash-attention's varlen kernel, which takes no mask.
    """
    plan = _plan(shape, train, device_memory, memory_source, longest_sample, flash_attention)
    if plan.fits:
        return plan

    def of(changed: TrainConfig) -> MemoryPlan:
        return _plan(shape, changed, device_memory, memory_source, longest_sample, flash_attention)

    changes = _changes(plan, shape, train, lambda changed: of(changed).total, longest_sample)
    together: list[Change] = []
    if changes and not any(c.fits for c in changes):
        # No single change fits: take the most effective, and again from there, until one fits.
        current, now = train, plan
        for _ in _SETTINGS:  # each setting changes once at most
            options = _changes(now, shape, current, lambda changed: of(changed).total, longest_sample)
            if not options:
                break
            fitting = [c for c in options if c.fits]
            together.append(fitting[0] if fitting else options[0])
            if fitting:
                break
            current = _apply(current, options[0])
            now = of(current)
        if not together or not together[-1].fits:
            together = []
    return dataclasses.replace(plan, changes=tuple(changes), together=tuple(together))


def _plan(
    shape: ModelShape, train: TrainConfig, memory: int, source: str, longest_sample: int, flash_attention: bool
) -> MemoryPlan:
    n = train.processes
    cpu = train.device.split(":")[0] == "cpu"
    compute = 2 if train.dtype == "bf16" else 4
    gathers = n > 1 or compute != 4  # FSDP2 all-gathers (and casts) each unit before it computes
    offload = train.offload_optimizer and not cpu
    lora = train.lora
    total_params = shape.parameters
    if lora is None:
        trainable = total_params
        layer_trainable, root_trainable = shape.layer_parameters, shape.root_parameters
    else:
        trainable = shape.lora_parameters(lora)
        in_layers = shape.lora_parameters(lora, in_layers_only=True)
        layer_trainable, root_trainable = in_layers // shape.layers, trainable - in_layers
    dtype = "bf16" if compute == 2 else "fp32"
    share = f", 1/{n} each" if n > 1 else ""
    host = 0

    stored = _ceil(total_params * 4, n)
    gathered = (shape.root_parameters + GATHERED_LAYERS * shape.layer_parameters) * compute if gathers else 0
    where = "in host memory" if offload else f"fp32{share}"
    how = f"{_count(total_params)} {where}"
    if gathers:
        how += f" + gathered {dtype}: embeddings/head and {GATHERED_LAYERS} layers"
    params = Term("parameters", (0 if offload else stored) + gathered, how)
    host += stored if offload else 0

    grads_stored = _ceil(trainable * 4, n)
    grads_gathered = (root_trainable + GATHERED_LAYERS * layer_trainable) * compute if gathers else 0
    what = "LoRA adapters'" if lora is not None else "every parameter's"
    how = f"{what} ({_count(trainable)}) {'in host memory' if offload else f'fp32{share}'}"
    if grads_gathered:
        how += f" + the gathered units' {dtype}"
    grads = Term("gradients", (0 if offload else grads_stored) + grads_gathered, how)
    host += grads_stored if offload else 0

    moments = _ceil(trainable * ADAM_BYTES, n)
    optimizer = Term(
        "optimizer state",
        0 if offload else moments,
        f"AdamW, 2 fp32 moments of {_count(trainable)}" + (" in host memory" if offload else share),
    )
    host += moments if offload else 0

    tokens = max(train.micro_batch_tokens, longest_sample)
    # Padded rows give SDPA a row x row padding mask, which each layer converts and keeps; packed
    # rows attend per sample with no mask (so does flash-attention on a GPU).
    row = min(tokens, longest_sample or tokens)
    masked = not train.packing and not (flash_attention and not cpu)
    layer = layer_activation_bytes(shape, compute, lora, mask_row=row if masked else 0)
    outside = (4 + 3 * compute) * shape.hidden_size  # the final norm (upcast to fp32) and the head's input
    # One layer more: the gradients of a layer's activations while its backward runs (with
    # checkpointing, besides the layer recomputed).
    if train.activation_checkpointing:
        per_token = shape.layers * shape.hidden_size * compute + 2 * layer + outside
        how = f"{tokens} tokens: {shape.layers} layer inputs + 1 layer recomputed, {dtype}"
    else:
        per_token = (shape.layers + 1) * layer + outside
        how = f"{tokens} tokens x {shape.layers} layers, {dtype}"
    activations = Term("activations", tokens * per_token, how + (f", {row}-token attention mask" if masked else ""))

    chunk = min(train.logprob_chunk_tokens, tokens)
    logits = chunk * shape.vocab_size * 4 * LOGPROB_BUFFERS
    how = f"{chunk} tokens x {shape.vocab_size} vocab, fp32 x {LOGPROB_BUFFERS}"
    if compute != 4:  # the head's weight is read in float32, and its gradient written so when it trains
        logits += shape.head_parameters * 4 * (2 if lora is None else 1)
        how += " + the head in fp32"
    logprob = Term("log-prob buffers", logits, how)

    if train.loss.beta <= 0:
        reference = Term("reference", 0, "none (loss.beta = 0)")
    elif lora is not None:
        reference = Term("reference", 0, "the base with its adapters off: no copy")
    else:
        copy = _ceil(total_params * 4, n)
        reference = Term(
            "reference", 0 if offload else copy, "frozen fp32 copy" + (" in host memory" if offload else share)
        )
        host += copy if offload else 0

    return MemoryPlan(
        model=shape.name,
        parameters=total_params,
        trainable=trainable,
        device=train.device,
        processes=n,
        ranks_per_device=n if cpu else 1,
        tokens=tokens,
        terms=(params, grads, optimizer, activations, logprob, reference),
        host_offload=host,
        device_memory=memory,
        memory_source=source,
        usable=memory if cpu else int(memory * (1 - GPU_RESERVE)),
    )


def layer_activation_bytes(
    shape: ModelShape, compute: int, lora: LoraConfig | None = None, *, mask_row: int = 0
) -> int:
    """Bytes one decoder layer saves per token for its backward (Llama/Qwen, SDPA or flash attention).

    Counted from what autograd keeps in a Hugging Face decoder layer: the two RMSNorms' inputs,
    normalised outputs (for their weights' gradients: not kept when LoRA freezes them) and scaled
    outputs (6h, 4h under LoRA); Qwen3's per-head q- and k-norms likewise; the query path (its
    projection, the rotated query, the attention output and the output projection's input: 3q);
    keys and values (2kv); the gated MLP's gate, activation, up and product (4i). The norms keep
    their input in float32 whatever the compute dtype. No sequence x sequence term for the scores:
    SDPA's and flash attention's kernels keep the log-sum-exp instead. ``mask_row``: the rows'
    length when SDPA takes an attention mask (packed or padded rows); the layer keeps the mask
    (``mask_row`` per token) in the compute dtype, and keys and values repeated to the query heads
    (Hugging Face drops grouped-query SDPA with a mask). LoRA adds each adapter's rank-sized middle
    and, with dropout, a dropped copy (and its mask) of each adapted layer's input.
    """
    h, q, kv, i = shape.hidden_size, shape.q_size, shape.kv_size, shape.intermediate_size
    normalised = 0 if lora is not None else 1
    attended = 2 * (q if mask_row else kv)
    elements = (4 + 2 * normalised) * h + 3 * q + attended + 4 * i + mask_row
    if shape.qk_norm:
        elements += (1 + normalised) * (q + kv)
    upcast = 2 * h + ((q + kv) if shape.qk_norm else 0)
    extra = 0
    if lora is not None:
        elements += lora.rank * shape.lora_modules(lora) // shape.layers
        if lora.dropout > 0:
            extra = (compute + 1) * shape.lora_inputs(lora) // shape.layers
    return compute * elements + (4 - compute) * upcast + extra


def _changes(
    plan: MemoryPlan, shape: ModelShape, train: TrainConfig, total: Callable[[TrainConfig], int], longest: int
) -> list[Change]:
    usable = plan.usable
    out: list[Change] = []
    gpu = plan.ranks_per_device == 1 and not train.device.startswith("cpu")
    if gpu:
        for n in range(train.processes + 1, MAX_PROCESSES + 1):
            if (t := total(dataclasses.replace(train, processes=n))) <= usable:
                out.append(Change("processes", n, t, True))
                break
    if train.lora is None:
        lora = LoraConfig()
        if all(any(m.name == name for m in shape.adaptable) for name in lora.target_modules):
            t = total(dataclasses.replace(train, lora=lora))
            out.append(Change("lora", lora, t, t <= usable))
    if not train.activation_checkpointing:
        t = total(dataclasses.replace(train, activation_checkpointing=True))
        out.append(Change("activation_checkpointing", True, t, t <= usable))
    floor = max(longest, 2)
    if train.micro_batch_tokens > floor:
        out.append(_fewer_tokens(train, floor, usable, total))
    if gpu and not train.offload_optimizer:
        t = total(dataclasses.replace(train, offload_optimizer=True))
        out.append(Change("offload_optimizer", True, t, t <= usable))
    # Most effective first; a change that saves nothing is no suggestion.
    return sorted((c for c in out if c.total < plan.total), key=lambda c: c.total)


def _fewer_tokens(train: TrainConfig, floor: int, usable: int, total: Callable[[TrainConfig], int]) -> Change:
    """The largest ``micro_batch_tokens`` that fits (a multiple of 128 where it can be), else the floor's."""

    def at(tokens: int) -> int:
        return total(dataclasses.replace(train, micro_batch_tokens=tokens))

    low, high = floor, train.micro_batch_tokens - 1
    if at(low) > usable:
        return Change("micro_batch_tokens", low, at(low), False)
    while low < high:  # the total grows with the tokens: the largest that fits
        mid = (low + high + 1) // 2
        low, high = (mid, high) if at(mid) <= usable else (low, mid - 1)
    rounded = low // 128 * 128
    best = rounded if rounded >= floor else low
    return Change("micro_batch_tokens", best, at(best), True)


def _apply(train: TrainConfig, change: Change) -> TrainConfig:
    return dataclasses.replace(train, **{change.setting: change.value})


class UnmeasuredDevice(ConfigError):
    """This machine cannot tell the device's memory: ``--device-memory`` gives it."""


def device_capacity(device: str, given: int | None = None) -> tuple[int, str]:
    """The memory of one ``device`` (bytes) and where the number comes from; ``given`` wins."""
    if given is not None:
        return given, f"{human_bytes(given)} given"
    kind, _, index = device.partition(":")
    if kind == "cpu":
        from sandrl.host_memory import mem_available_bytes

        available = mem_available_bytes()
        if available is not None:
            return available, f"{human_bytes(available)} of host memory available"
    elif kind == "cuda":
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(int(index or 0))
            return int(props.total_memory), f"{props.name}, {human_bytes(props.total_memory)}"
    raise UnmeasuredDevice(
        f"planning for {device}, whose memory this machine cannot measure: give one device's memory with "
        "--device-memory, e.g. --device-memory 80GiB for an H100 or A100 80GB"
    )


_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)\s*", re.IGNORECASE)
_UNITS = {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}


def parse_size(text: str) -> int:
    """Bytes of ``80GiB``, ``80G`` (both 2^30), ``80GB`` (10^9), ``512MiB``, ``1.5TiB`` or a plain number."""
    match = _SIZE.fullmatch(text)
    if not match:
        raise ConfigError(f"--device-memory takes a size such as 80GiB, 512MiB or 81920MB; got {text!r}")
    number, unit = float(match.group(1)), match.group(2).lower()
    prefix = unit[:1] if unit[:1] in "kmgt" else ""
    decimal = bool(prefix) and unit == prefix + "b"  # GB is 10^9; G and GiB are 2^30
    scale = 1000 ** " kmgt".index(prefix) if decimal else 1 << _UNITS[prefix]
    value = int(number * scale)
    if value <= 0:
        raise ConfigError(f"--device-memory must be more than 0, got {text!r}")
    return value


def human_bytes(nbytes: int) -> str:
    """GiB with one decimal; MiB under one GiB (a tiny model's terms would all read 0.0 GiB)."""
    if nbytes >= 1 << 30:
        return f"{nbytes / (1 << 30):.1f} GiB"
    return f"{nbytes / (1 << 20):.0f} MiB"


def _count(n: int) -> str:
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.2f}{suffix}"
    return str(n)


def _ceil(a: int, b: int) -> int:
    return math.ceil(a / b)
