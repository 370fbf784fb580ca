"""The shape of a policy built from a config (``model = "tiny"``), apart from the code that builds it
(:func:`sandrl.inference.model.build_tiny_model`), so that reading a config loads no PyTorch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class TinyModelConfig:
    """A small causal LM over the byte tokenizer, for tests, demos and CPU-only runs."""

    architecture: Literal["llama", "qwen2", "qwen3"] = "llama"
    """Which Hugging Face architecture to instantiate; all three are what real policies use."""
    hidden_size: int = 64
    """The width of the residual stream (each token's vector between layers)."""
    num_layers: int = 2
    """Decoder layers (attention and MLP blocks)."""
    num_heads: int = 4
    """Attention (query) heads per layer; ``hidden_size`` must be a multiple of it."""
    num_kv_heads: int = 2
    """Fewer key/value heads than query heads (grouped-query attention), as in Llama 3 and Qwen2."""
    intermediate_size: int = 128
    """The width of each layer's MLP."""
    max_position_embeddings: int = 2048
    """The context length: prompt plus output."""
    seed: int = 0
    """Seed of the random initialisation: the same seed gives the same weights, bit for bit."""
