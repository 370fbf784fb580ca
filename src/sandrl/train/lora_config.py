"""The ``[train.lora]`` settings: low-rank adapters on the policy (see :mod:`sandrl.train.lora`).

Apart from the adapters' code, so that reading a run's config (``sandrl train`` refusing a bad key, the
config reference) loads neither ``peft`` nor PyTorch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from sandrl.errors import ConfigError

LoraExport = Literal["merged", "adapter"]

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Every linear layer of a Llama/Qwen decoder block (attention and MLP), as most LoRA RL recipes target."""


@dataclass(frozen=True)
class LoraConfig:
    """Low-rank adapters on the policy (``[train.lora]``); only they train."""

    rank: int = 16
    """The adapters' rank ``r``: trainable parameters per targeted layer are ``r * (in + out)``."""
    alpha: float = 32.0
    """The scale of the adapters' update is ``alpha / rank`` (LoRA, arXiv:2106.09685); 2x the rank is usual."""
    dropout: float = 0.0
    """Dropout on the adapters' input while training (0 keeps the trainer's and the server's log-probs equal)."""
    target_modules: tuple[str, ...] = DEFAULT_TARGETS
    """Names of the linear layers that get adapters (the last part of the module's name, as ``peft`` matches)."""
    export: LoraExport = "merged"
    """What ``export_weights`` writes for the inference server: ``merged`` (the adapters folded into a full
    checkpoint, which any server loads) or ``adapter`` (the ``peft`` adapter alone, for servers that load
    adapters: SGLang's ``load_lora_adapter``, vLLM's ``load_lora_adapter``, the embedded engine)."""

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ConfigError(f"rank must be >= 1 (8 to 64 is usual), got {self.rank}")
        if not math.isfinite(self.alpha) or self.alpha <= 0:
            raise ConfigError(f"alpha must be a finite number > 0 (2x the rank is usual), got {self.alpha!r}")
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"dropout must be in [0, 1), got {self.dropout!r}")
        if not self.target_modules or not all(self.target_modules):
            raise ConfigError(
                "target_modules must name at least one linear layer, e.g. ['q_proj', 'v_proj']; "
                f"got {list(self.target_modules)!r}"
            )


def check_targets(cfg: LoraConfig, linears: Iterable[str], tied: Iterable[str], model: str) -> None:
    """Refuse ``cfg.target_modules`` that name no linear layer of ``model`` (its layers' last names are
    ``linears``), or one whose weight is the token embeddings' (``tied``): the trainer when it adapts the
    model and ``--plan`` when it counts the adapters say the same."""
    valid = sorted(set(linears))
    unknown = [t for t in cfg.target_modules if t not in valid]
    if unknown:
        raise ConfigError(
            f"[train.lora] target_modules: {', '.join(map(repr, unknown))} names no linear layer of {model}; "
            f"its linear layers are {', '.join(valid)}"
        )
    shared = sorted(set(tied) & set(cfg.target_modules))
    if shared:
        raise ConfigError(
            f"[train.lora] target_modules: {shared[0]!r} shares its weight with the token embeddings "
            "(tie_word_embeddings), so an adapter on it could be neither merged nor served; leave it out"
        )
