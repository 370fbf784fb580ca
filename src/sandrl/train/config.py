"""The trainer's part of the run config: :class:`TrainConfig`, read from a ``[train]`` TOML table.

.. code-block:: toml

    [train]
    lr = 1e-5
    micro_batch_tokens = 8192

    [train.loss]            # sandrl.train.losses.LossConfig
    loss_type = "dapo"
    epsilon_high = 0.28

TOML has no null, so an optional setting is switched off with ``false`` (``tis_cap = false``,
``max_grad_norm = false``). Every field is checked when the config is built; a wrong key, type
or value is a :class:`~sandrl.errors.ConfigError` that names the key and what would be valid; the
table is read by :func:`sandrl.toml_config.from_mapping`, the one reader of typed tables.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sandrl.errors import ConfigError
from sandrl.toml_config import from_mapping, read_toml, to_table
from sandrl.train.lora_config import LoraConfig
from sandrl.train.loss_config import LossConfig
from sandrl.train.truncation import TRUNCATED_BY, OnTruncated, TruncatedBy, check_settings

DType = Literal["fp32", "bf16"]


@dataclass(frozen=True)
class TrainConfig:
    """How the trainer updates the policy. The loss itself is :class:`~sandrl.train.losses.LossConfig`."""

    lr: float = 1e-5
    """AdamW's peak learning rate."""
    warmup_steps: int = 0
    """Updates over which the learning rate rises linearly from ``lr / warmup_steps`` to ``lr``."""
    decay_steps: int = 0
    """After warmup, the learning rate follows a cosine from ``lr`` down to ``lr * min_lr_ratio`` over
    this many updates and stays there (Loshchilov & Hutter 2017, SGDR, arXiv:1608.03983); 0: constant.
    Set it to the run's steps to anneal to the end; RL on a small policy drifts once its reward
    saturates under a constant rate."""
    min_lr_ratio: float = 0.0
    """The floor of the cosine decay, as a fraction of ``lr``."""
    weight_decay: float = 0.0
    """AdamW's decoupled weight decay (Loshchilov & Hutter 2019, arXiv:1711.05101)."""
    adam_beta1: float = 0.9
    """AdamW's decay rate of the gradient's running mean (Kingma & Ba 2015, arXiv:1412.6980)."""
    adam_beta2: float = 0.999
    """AdamW's decay rate of the squared gradient's running mean (Kingma & Ba 2015, arXiv:1412.6980)."""
    adam_eps: float = 1e-8
    """Added to AdamW's denominator, so a parameter with tiny gradients does not take huge steps."""
    max_grad_norm: float | None = 1.0
    """Clip the global gradient norm to this before each update; None disables clipping."""
    micro_batch_tokens: int = 8192
    """Token budget of one forward (rows x longest row, padding included); gradients of the micro-batches of
    an update are accumulated, so this bounds memory and leaves the result unchanged. A sample longer than
    the budget is forwarded alone."""
    minibatches: int = 1
    """Optimizer updates per batch: the batch is split into this many parts, updated on one after the other
    (PPO's minibatches; with more than one, the clipping in the loss takes effect)."""
    device: str = "cpu"
    """Where the model trains: ``cpu``, ``cuda``, ``cuda:1``, ``mps``... (any torch device). Checked against the
    installed torch when the run starts; ``cuda`` needs a CUDA build of torch in place of the CPU one
    (``pip uninstall -y torch && pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128``,
    the version sandrl pins)."""
    keep_checkpoints: int = 2
    """Checkpoints kept by :meth:`~sandrl.train.trainer.Trainer.save_checkpoint`; older ones are deleted."""
    processes: int = 1
    """Training processes (ranks) of one FSDP2 data-parallel group: parameters, gradients and optimizer
    state are sharded across them (``torch.distributed.fsdp.fully_shard``), each forwards its share of
    every micro-batch. One per GPU on a GPU host (NCCL); on CPU they use gloo. ``sandrl train --nproc N``."""
    dtype: DType = "fp32"
    """``bf16``: parameters are gathered and computed in bfloat16, gradients are reduced and the optimizer
    steps in float32 (FSDP2's ``MixedPrecisionPolicy``); log-probs are computed in float32 from the bf16
    hidden states. ``fp32`` everywhere otherwise (the default, and the only choice that is exact on CPU)."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass instead of keeping them: activation
    memory falls from every layer's to about one layer's, for about a third more compute."""
    logprob_chunk_tokens: int = 512
    """Token log-probs (and the entropy) are computed this many positions at a time from the final hidden
    states, so the ``[tokens, vocab]`` logits of a whole micro-batch are never built (at 32k tokens and a
    152k vocabulary they would take ~20 GB in float32). A chunk's pass holds about five buffers of
    ``chunk x vocab`` floats at its peak (logits, softmax, their products): 512 keeps the peak under a
    tenth of the full logits at 8k tokens, for no measurable time."""
    packing: bool = True
    """Micro-batches pack samples end to end up to ``micro_batch_tokens`` (position ids restart at every
    sample; attention never crosses one) instead of padding each row to the longest. Each sample is
    attended on its own: flash-attention's varlen kernel where the model uses it, else sandrl's packed
    attention (SDPA per group of similar lengths), so a row costs what its samples cost."""
    offload_optimizer: bool = False
    """Keep the sharded parameters' optimizer state (and the parameters between uses) in host memory
    (FSDP2's ``CPUOffloadPolicy``): GPU memory for host memory and PCIe time."""
    on_truncated: OnTruncated = "train"
    """What an episode that a budget cut short (``truncated_by``) trains as (:mod:`sandrl.train.truncation`).

    - ``train``: as a finished one.
    - ``mask``: no policy-gradient token from it; its reward still counts in its group's mean and spread
      (DAPO's overlong filtering, Yu et al. 2025, arXiv:2503.14476). For rewards a cut makes noisy: a
      right answer cut before it was submitted.
    - ``penalty``: DAPO's soft overlong punishment (arXiv:2503.14476): every episode's reward falls
      linearly from 0 to ``-overlong_penalty`` over the last ``overlong_buffer`` tokens before
      ``[rollout] max_total_tokens``, and an episode the token budget cut gets the whole
      ``-overlong_penalty``; one the turn budget cut gets ``-overlong_penalty``; one the time budget cut
      is masked (its time depends on the machines' load, not on the policy alone). For a policy that
      learns to ramble until it is cut.

    With ``[rollout] max_turns = 1`` every episode that acts ends on its turn budget: leave ``max_turns``
    out of ``truncated_by`` there."""
    truncated_by: tuple[TruncatedBy, ...] = TRUNCATED_BY
    """The budgets ``on_truncated`` acts on: ``max_tokens`` (the conversation reached ``[rollout]
    max_total_tokens``), ``max_turns``, ``wall_time``; an episode another budget cut trains as a finished one.
    Without ``max_tokens``, ``penalty`` shapes no length either."""
    overlong_buffer: int = 4096
    """With ``on_truncated = "penalty"``: the tokens before the token budget over which the length penalty
    ramps up (DAPO's ``L_cache``: 4096 before a budget of 20480); 0: only an episode the budget cut is
    penalised. Must be less than ``[rollout] max_total_tokens``."""
    overlong_penalty: float = 1.0
    """With ``on_truncated = "penalty"``: the largest penalty subtracted from a reward (DAPO: 1, against
    rewards of -1 and 1). Against a verifier's 0 or 1, 1 makes a passing episode that the budget cut score
    as a failing one that finished."""
    lora: LoraConfig | None = None
    """Low-rank adapters (``[train.lora]``, through ``peft``): only they train; absent trains every weight."""
    loss: LossConfig = field(default_factory=LossConfig)
    """``[train.loss]``: the policy loss: its estimator (PPO's clip, GSPO, CISPO), aggregation (GRPO, Dr. GRPO,
    DAPO), advantages (GRPO, RLOO, REINFORCE++), clipping, KL and importance sampling
    (``docs/guide/learning-signal.md``)."""

    def __post_init__(self) -> None:
        if not math.isfinite(self.lr) or self.lr <= 0:
            raise ConfigError(f"lr must be a finite number > 0 (1e-6 to 1e-5 is usual for RL), got {self.lr!r}")
        if self.warmup_steps < 0:
            raise ConfigError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.decay_steps < 0:
            raise ConfigError(f"decay_steps must be >= 0 (0: no decay), got {self.decay_steps}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio!r}")
        if not math.isfinite(self.weight_decay) or self.weight_decay < 0:
            raise ConfigError(f"weight_decay must be a finite number >= 0, got {self.weight_decay!r}")
        for name in ("adam_beta1", "adam_beta2"):
            value = getattr(self, name)
            if not 0 <= value < 1:
                raise ConfigError(f"{name} must be in [0, 1), got {value!r}")
        if not math.isfinite(self.adam_eps) or self.adam_eps <= 0:
            raise ConfigError(f"adam_eps must be a finite number > 0, got {self.adam_eps!r}")
        if self.max_grad_norm is not None and (not math.isfinite(self.max_grad_norm) or self.max_grad_norm <= 0):
            raise ConfigError(
                f"max_grad_norm must be a number > 0, or absent to disable clipping; got {self.max_grad_norm!r}"
            )
        if self.micro_batch_tokens < 2:
            raise ConfigError(f"micro_batch_tokens must be >= 2, got {self.micro_batch_tokens}")
        if self.minibatches < 1:
            raise ConfigError(f"minibatches must be >= 1, got {self.minibatches}")
        if not self.device:
            raise ConfigError("device must name a torch device, e.g. 'cpu' or 'cuda'")
        if self.keep_checkpoints < 1:
            raise ConfigError(f"keep_checkpoints must be >= 1, got {self.keep_checkpoints}")
        if self.processes < 1:
            raise ConfigError(f"processes must be >= 1 (the training ranks: 1, or one per GPU), got {self.processes}")
        if self.offload_optimizer and self.device == "cpu":
            raise ConfigError(
                "offload_optimizer moves a GPU's optimizer state (and idle parameters) into host memory; "
                'with device = "cpu" they are there already: set offload_optimizer = false'
            )
        check_settings(self.on_truncated, self.truncated_by, self.overlong_buffer, self.overlong_penalty)
        if self.logprob_chunk_tokens < 1:
            raise ConfigError(f"logprob_chunk_tokens must be >= 1 (512 is usual), got {self.logprob_chunk_tokens}")

    @classmethod
    def from_mapping(cls, table: Mapping[str, object], *, where: str = "[train]") -> TrainConfig:
        """Build from a parsed TOML table; ``where`` names it in error messages."""
        return from_mapping(cls, table, where=where)

    @classmethod
    def from_toml(cls, path: str | Path, *, table: str = "train") -> TrainConfig:
        """Read the ``[table]`` of a TOML file (all defaults if the file has no such table)."""
        file = Path(path)
        data = read_toml(file)
        section = data.get(table, {})
        return from_mapping(cls, section, where=f"{file}: [{table}]")

    def to_dict(self) -> dict[str, Any]:
        """A plain dict (TOML/JSON-ready: None is written ``false``) that :meth:`from_mapping` reads back."""
        return to_table(self)
