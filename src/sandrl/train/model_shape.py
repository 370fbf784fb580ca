"""What the memory plan needs to know of a model, read from its config alone: no weights loaded.

The model is instantiated on PyTorch's ``meta`` device (shapes without storage), so a 7B
checkpoint directory is planned from its ``config.json`` in a second or two, on any machine,
and the parameter counts are exact: the model's own modules are counted, not a formula of its
config. The LoRA adapters a :class:`~sandrl.train.lora.LoraConfig` would add are counted the way
``peft`` adds them (``rank * (in + out)`` per targeted linear layer).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sandrl.errors import ConfigError
from sandrl.train.lora_config import LoraConfig, check_targets


class UnknownArchitecture(ConfigError):
    """The model is not a Llama/Qwen-style decoder (``model.layers``): the plan cannot count its activations."""


@dataclass(frozen=True)
class Adaptable:
    """A linear layer ``peft`` can put an adapter on: its name's last part and its shape."""

    name: str
    in_features: int
    out_features: int
    in_layer: bool
    """Inside a decoder layer (sharded and gathered with it), or in the root (the head)."""
    tied: bool = False
    """Its weight is the token embeddings' (``tie_word_embeddings``): no adapter can go there."""


@dataclass(frozen=True)
class ModelShape:
    """Exact parameter counts and the activation dimensions of a Llama/Qwen-style decoder."""

    name: str
    parameters: int
    """Every parameter, a tied embedding and head counted once."""
    layers: int
    layer_parameters: int
    """The largest decoder layer's (FSDP2 gathers one layer at a time)."""
    hidden_size: int
    intermediate_size: int
    q_size: int
    """Query heads x head dimension."""
    kv_size: int
    """Key/value heads x head dimension."""
    vocab_size: int
    qk_norm: bool
    """Qwen3's per-head norms of queries and keys: each saves its input and output for the backward."""
    adaptable: tuple[Adaptable, ...]

    @property
    def root_parameters(self) -> int:
        """Outside the decoder layers: embeddings, final norm, head (FSDP2's root unit)."""
        return self.parameters - self.layers * self.layer_parameters

    @property
    def head_parameters(self) -> int:
        return self.vocab_size * self.hidden_size

    def lora_parameters(self, lora: LoraConfig, *, in_layers_only: bool = False) -> int:
        """The adapters' parameters (all of them train): ``rank * (in + out)`` per targeted module."""
        return sum(
            lora.rank * (m.in_features + m.out_features)
            for m in self._targets(lora)
            if m.in_layer or not in_layers_only
        )

    def lora_modules(self, lora: LoraConfig) -> int:
        """How many modules get an adapter."""
        return len(self._targets(lora))

    def lora_inputs(self, lora: LoraConfig) -> int:
        """The input features of the decoder layers' adapted modules, summed (what adapter dropout copies)."""
        return sum(m.in_features for m in self._targets(lora) if m.in_layer)

    def _targets(self, lora: LoraConfig) -> list[Adaptable]:
        tied = [m.name for m in self.adaptable if m.tied]
        check_targets(lora, (m.name for m in self.adaptable), tied, self.name)
        return [m for m in self.adaptable if m.name in lora.target_modules]


def model_shape(name: str) -> ModelShape:
    """The shape of ``[model] name``: ``tiny`` or a local checkpoint directory (only its config.json is read)."""
    from sandrl.inference.tokenizer import TINY

    if name == TINY:
        from sandrl.inference.model import build_tiny_model

        with torch.device("meta"):
            model, _ = build_tiny_model()
        return shape_of(model, TINY)
    return shape_of(_meta_model(Path(name).expanduser()), name)


def shape_of(model: Any, name: str) -> ModelShape:
    """The shape of a Hugging Face causal LM (on any device, ``meta`` included)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder = inner.get_decoder() if hasattr(inner, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or not len(layers):
        raise UnknownArchitecture(
            f"{name}: {type(inner).__name__} has no list of decoder layers (model.layers); the memory plan knows "
            "Llama/Qwen-style decoders"
        )
    config = inner.config
    hidden = int(config.hidden_size)
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    unique = {id(p): p.numel() for p in inner.parameters()}
    per_layer = [sum(p.numel() for p in layer.parameters()) for layer in layers]
    in_layer = {id(m) for layer in layers for m in layer.modules()}
    embeddings = inner.get_input_embeddings().weight
    adaptable = tuple(
        Adaptable(
            qualified.rpartition(".")[2],
            module.in_features,
            module.out_features,
            id(module) in in_layer,
            module.weight is embeddings,
        )
        for qualified, module in inner.named_modules()
        if isinstance(module, torch.nn.Linear)
    )
    attention = getattr(layers[0], "self_attn", None)
    return ModelShape(
        name=name,
        parameters=sum(unique.values()),
        layers=len(layers),
        layer_parameters=max(per_layer),
        hidden_size=hidden,
        intermediate_size=int(getattr(config, "intermediate_size", None) or 4 * hidden),
        q_size=heads * head_dim,
        kv_size=kv_heads * head_dim,
        vocab_size=int(config.vocab_size),
        qk_norm=attention is not None and hasattr(attention, "q_norm"),
        adaptable=adaptable,
    )


def _meta_model(path: Path) -> Any:
    import transformers

    if not (path / "config.json").is_file():
        where = "does not exist" if not path.exists() else "has no config.json"
        raise ConfigError(
            f"model path {path} {where}: the memory plan reads a Hugging Face checkpoint's config.json "
            "('tiny', or a local checkpoint directory)"
        )
    try:
        config = transformers.AutoConfig.from_pretrained(str(path), local_files_only=True)
        auto: Any = transformers.AutoModelForCausalLM
        with torch.device("meta"):
            return auto.from_config(config)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"cannot read the model config in {path}: {exc}") from exc
