"""LoRA through ``peft``: the ``[train.lora]`` settings, the adapted policy, and what it exports.

Low-rank adapters (Hu et al. 2021, *LoRA: Low-Rank Adaptation of Large Language Models*,
arXiv:2106.09685) train two small matrices per targeted linear layer and leave the base weights
frozen: the trainable state and its optimizer moments shrink by orders of magnitude, and the KL
reference is the same model with its adapters switched off (no second copy).

- :func:`apply_lora` wraps the policy in ``peft`` (only the adapters require grad);
- :func:`adapters_disabled` is the reference: the same modules, adapters off, inside a ``with``;
- :func:`lora_state_dict` / :func:`load_lora_state_dict`: what a checkpoint holds of the policy;
- :func:`export_lora` writes what the inference server loads: the merged model (``export = "merged"``,
  any server) or the adapter with sandrl's marker of its base (``"adapter"``: SGLang's and vLLM's
  ``load_lora_adapter``, and the embedded engine, which refuses an adapter of another base).

The settings themselves (:class:`LoraConfig`) live in :mod:`sandrl.train.lora_config`, which a config
loads without ``peft`` or PyTorch.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import peft
import torch

from sandrl.errors import ConfigError
from sandrl.inference.lora_adapter import BASE_FILE, base_signature
from sandrl.inference.model import save_weights
from sandrl.inference.tokenizer import Tokenizer
from sandrl.train.lora_config import LoraConfig, check_targets

_PEFT_PREFIX = "base_model.model."
"""Where ``peft`` puts the wrapped model in its own state dict's names."""

_INIT_SEED = 0
"""The seed of the adapters' random initialisation (``lora_A``; ``lora_B`` starts at zero)."""


def apply_lora(model: Any, cfg: LoraConfig) -> Any:
    """``model`` (a transformers causal LM) with ``cfg``'s adapters, through ``peft.get_peft_model``.

    Only the adapters' parameters require grad afterwards. ``model`` itself is adapted in place (its
    targeted linear layers are wrapped); use the returned ``peft`` model from then on.
    """
    if isinstance(model, peft.PeftModel):
        raise TypeError("apply_lora: the model already has adapters; apply them once, to the base model")
    linears = {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    embeddings = model.get_input_embeddings().weight
    tied = [n.rsplit(".", 1)[-1] for n, m in linears.items() if m.weight is embeddings]
    check_targets(cfg, (name.rsplit(".", 1)[-1] for name in linears), tied, "this model")
    config = peft.LoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,  # type: ignore[arg-type]  # peft annotates int; it scales by alpha / r in float
        lora_dropout=cfg.dropout,
        target_modules=list(cfg.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    # Seeded: every rank (and a resumed or repeated run) starts from the same adapters, whatever the RNG
    # went through before; FSDP2 then keeps each rank's shard of one and the same initialisation.
    with _peft_quiet(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(_INIT_SEED)
        return peft.get_peft_model(model, config)


@contextlib.contextmanager
def adapters_disabled(model: Any) -> Iterator[Any]:
    """Within the block, ``model`` computes as its base (the KL reference): no copy, no change to the adapters."""
    _check_peft(model, "adapters_disabled")
    with model.disable_adapter():
        yield model


@contextlib.contextmanager
def adapters_zeroed(model: Any) -> Iterator[Any]:
    """Within the block, every adapter's update is scaled by 0: ``model`` computes as its base (``x + 0``)
    while its adapters still take part in the forward (as a sharded model's units need)."""
    _check_peft(model, "adapters_zeroed")
    layers = [m for m in model.modules() if isinstance(m, peft.tuners.lora.LoraLayer)]
    saved = [dict(layer.scaling) for layer in layers]
    try:
        for layer in layers:
            for name in layer.scaling:
                layer.scaling[name] = 0.0
        yield model
    finally:
        for layer, scaling in zip(layers, saved, strict=True):
            layer.scaling.update(scaling)


def lora_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """The adapters' weights (``peft``'s names, without the adapter's name): what a checkpoint of the policy holds."""
    _check_peft(model, "lora_state_dict")
    state: dict[str, torch.Tensor] = peft.get_peft_model_state_dict(model)
    return state


def load_lora_state_dict(model: Any, state: dict[str, torch.Tensor]) -> None:
    """Put the adapters' weights of :func:`lora_state_dict` back into ``model``; names and shapes must match."""
    _check_peft(model, "load_lora_state_dict")
    expected = {k: v.shape for k, v in lora_state_dict(model).items()}
    missing = sorted(expected.keys() - state.keys())
    unexpected = sorted(state.keys() - expected.keys())
    mismatched = sorted(k for k in expected.keys() & state.keys() if tuple(state[k].shape) != tuple(expected[k]))
    if missing or unexpected or mismatched:
        first = [f"missing {k}" for k in missing] + [f"unexpected {k}" for k in unexpected] + mismatched
        raise ConfigError(
            f"the checkpoint's LoRA adapters do not fit the policy ({first[0]}; "
            f"{len(missing)} missing, {len(unexpected)} unexpected, {len(mismatched)} of another shape): resume "
            "with the [train.lora] settings (rank, target_modules) the checkpoint was written with"
        )
    peft.set_peft_model_state_dict(model, state)


def export_lora(
    model: Any,
    path: str | Path,
    cfg: LoraConfig,
    tokenizer: Tokenizer | None = None,
    *,
    state_dict: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write the adapted policy to ``path`` as ``cfg.export`` says, atomically (staged, then renamed into place).

    ``merged``: a full Hugging Face checkpoint, the adapters folded into the base weights (no ``peft`` names),
    with ``tokenizer``: what :func:`~sandrl.inference.model.load_model`, ``update_weights_from_disk`` and
    transformers load. ``adapter``: ``peft``'s adapter directory (``adapter_config.json`` +
    ``adapter_model.safetensors``) and :data:`~sandrl.inference.lora_adapter.BASE_FILE`, the base's signature.
    ``model`` is left as it was: the merge is computed beside it, never in its weights.

    ``state_dict``: the peft model's full state dict (``model.state_dict()``'s names), when its own
    parameters are sharded (FSDP2: gathered with ``get_model_state_dict(..., full_state_dict=True)``).
    """
    _check_peft(model, "export_lora")
    base = model.get_base_model()
    state = state_dict if state_dict is not None else model.state_dict()
    with torch.no_grad(), _peft_quiet():
        if cfg.export == "merged":
            return save_weights(base, path, tokenizer, state_dict=merged_state_dict(model, state))
        plain = _plain_state(model, state)
        marker = base_signature(
            {k: v for k, v in plain.items() if ".lora_" not in k}, str(base.config.model_type), _base_name(base)
        )
        adapters = {f"{_PEFT_PREFIX}{k}": v for k, v in plain.items() if ".lora_" in k}
        return save_weights(_AdapterExport(model, marker, adapters), path)


def base_state_dict(model: Any, state_dict: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The base model's weights under the plain model's names (``...q_proj.weight``), adapters left out.

    ``state_dict``: the peft model's (default: ``model.state_dict()``)."""
    return {k: v for k, v in _plain_state(model, state_dict).items() if ".lora_" not in k}


def merged_state_dict(model: Any, state_dict: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The base's weights with each active adapter's ``scaling * B @ A`` added, in float32 then cast back to the
    weight's dtype (new tensors: ``model`` is unchanged). ``state_dict``: the peft model's (default: its own)."""
    state = _plain_state(model, state_dict)
    merged = {k: v for k, v in state.items() if ".lora_" not in k}
    base = model.get_base_model()
    with torch.no_grad():
        for name, layer in base.named_modules():
            if isinstance(layer, peft.tuners.lora.Linear):
                module = plain_name(name)
                for adapter in layer.active_adapters:
                    a = state[f"{module}.lora_A.{adapter}.weight"].float()
                    b = state[f"{module}.lora_B.{adapter}.weight"].float()
                    weight = merged[f"{module}.weight"]
                    merged[f"{module}.weight"] = (weight.float() + (b @ a) * layer.scaling[adapter]).to(weight.dtype)
    output = base.get_output_embeddings()
    if getattr(base.config, "tie_word_embeddings", False) and output is not None:
        # Tied to the embeddings (never adapted: apply_lora refuses it), so not written twice, even when a
        # gathered state dict holds it as a tensor of its own.
        merged.pop(next(plain_name(f"{n}.weight") for n, m in base.named_modules() if m is output), None)
    return merged


def plain_name(name: str) -> str:
    """A parameter's or module's name as in the plain transformers model: without ``peft``'s prefix and
    ``base_layer``, and without the segments ``torch.compile`` and activation checkpointing wrappers add."""
    for wrapper in ("_orig_mod.", "_checkpoint_wrapped_module."):
        name = name.replace(wrapper, "")
    return name.removeprefix(_PEFT_PREFIX).replace(".base_layer.", ".").replace(".base_layer", "")


def _plain_state(model: Any, state_dict: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
    state = state_dict if state_dict is not None else model.state_dict()
    return {plain_name(k): v.detach() for k, v in state.items()}


class _AdapterExport:
    """What :func:`~sandrl.inference.model.save_weights` stages for an adapter export: peft's files and the marker."""

    def __init__(self, model: Any, marker: dict[str, Any], state_dict: dict[str, torch.Tensor]) -> None:
        self.model = model
        self.marker = marker
        self.state_dict = state_dict

    def save_pretrained(self, directory: str) -> None:
        self.model.save_pretrained(directory, safe_serialization=True, state_dict=self.state_dict)
        (Path(directory) / BASE_FILE).write_text(json.dumps(self.marker))


@contextlib.contextmanager
def _peft_quiet() -> Iterator[None]:
    """peft 0.21 asks transformers 5 a deprecated question (``is_gradient_checkpointing``): its noise, not ours."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning, message=".*is_gradient_checkpointing.*")
        yield


def _base_name(base: Any) -> str:
    return str(getattr(base.config, "name_or_path", "") or getattr(base.config, "model_type", ""))


def _check_peft(model: Any, what: str) -> None:
    if not isinstance(model, peft.PeftModel):
        raise TypeError(f"{what} needs the model apply_lora returned, got {type(model).__name__}")
