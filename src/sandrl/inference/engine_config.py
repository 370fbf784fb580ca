"""The embedded engine's settings (:class:`EngineConfig`) and the counters of its decode loop (:class:`EngineStats`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sandrl.errors import ConfigError
from sandrl.inference.base import UPDATE_POLICIES, UpdatePolicy
from sandrl.inference.tiny_config import TinyModelConfig


@dataclass(frozen=True)
class EngineConfig:
    """How the engine batches; the model itself is chosen by name (see :meth:`Engine.load`)."""

    max_batch_size: int = 64
    """Most requests decoded together; more wait in the queue."""
    max_prefill_tokens: int = 8192
    """Most (padded) prompt tokens prefilled in one step, so a burst of long prompts does not stall decoding."""
    seed: int = 0
    """Seeds the samplers of requests that bring no seed, so a whole run is reproducible."""
    num_threads: int | None = None
    """Intra-op threads of the engine thread (other threads keep theirs). None: 1 for models under
    50M parameters, whose matrices are too small for threads to pay for their synchronisation (and
    which slow down tenfold when another process competes for the cores), else torch's default."""
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    """The shape of the ``tiny`` model, when that is the model served."""
    update_policy: UpdatePolicy = "in_place"
    """What a weight update does to requests in flight (see :mod:`sandrl.inference.engine`); an update may say."""
    max_loras: int = 8
    """LoRA adapters held by name at once (``/load_lora_adapter``; SGLang's ``--max-loaded-loras``), counting unloaded
    ones that running requests still use: loading one more is refused until one is unloaded. Each costs its own
    ``r * (in + out)`` numbers per adapted layer (:mod:`sandrl.inference.lora_rows`), never a copy of the model."""
    max_lora_rank: int = 256
    """The largest rank of an adapter the engine loads (SGLang's ``--max-lora-rank``); it also bounds the size of
    an adapter file the engine reads."""
    prefix_cache_tokens: int = 32768
    """Tokens of finished sequences whose KV the engine keeps for requests that extend them (the next turn of
    an episode: :mod:`sandrl.inference.prefix_cache`; SGLang's radix cache), least recently used evicted first;
    0 turns it off. Each token holds ``2 x layers x kv_heads x head_dim`` numbers (the tiny model: 512 bytes)."""
    kv_cache_tokens: int = 0
    """Tokens the running requests' KV cache may hold (SGLang's ``--max-total-tokens``): a request is admitted
    while its context fits, the newest running requests are retracted when decoding runs out of room, and a
    request's ``max_new_tokens`` is capped at this less its prompt (:mod:`sandrl.inference.kv_budget`); 0: no
    bound. The engine reports its load and room against it (``/v1/loads``)."""

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ConfigError(f"num_threads must be >= 1, got {self.num_threads}")
        if self.max_prefill_tokens < 1:
            raise ConfigError(f"max_prefill_tokens must be >= 1, got {self.max_prefill_tokens}")
        if self.update_policy not in UPDATE_POLICIES:
            raise ConfigError(f"update_policy must be one of {', '.join(UPDATE_POLICIES)}, got {self.update_policy!r}")
        if self.max_loras < 0:
            raise ConfigError(f"max_loras must be >= 0 (0 serves no LoRA adapter by name), got {self.max_loras}")
        if self.max_lora_rank < 1:
            raise ConfigError(f"max_lora_rank must be >= 1, got {self.max_lora_rank}")
        if self.prefix_cache_tokens < 0:
            raise ConfigError(
                f"prefix_cache_tokens must be >= 0 (0 turns the prefix cache off), got {self.prefix_cache_tokens}"
            )
        if self.kv_cache_tokens < 0:
            raise ConfigError(f"kv_cache_tokens must be >= 0 (0: no bound), got {self.kv_cache_tokens}")


@dataclass
class EngineStats:
    """Counters of the decode loop (read them for benchmarks and tests; they only grow)."""

    steps: int = 0
    """Decode forwards run."""
    decoded_tokens: int = 0
    """Tokens sampled in decode steps (the sum of the batch sizes)."""
    prefills: int = 0
    prefill_tokens: int = 0
    """Context tokens the prefills computed (padding not counted; a cached prefix is not computed)."""
    cached_tokens: int = 0
    """Context tokens the prefills took from the prefix cache instead."""
    max_batch: int = 0
    """The largest number of requests decoded in one step."""
    weight_updates: int = 0
    kv_retractions: int = 0
    """Running requests retracted because decoding ran out of KV room (``kv_cache_tokens``): each dropped its
    KV and waited to be prefilled again (SGLang's retracted requests, vLLM's preemptions)."""
