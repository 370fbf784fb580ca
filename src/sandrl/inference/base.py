"""The inference interfaces: what every policy backend offers and every caller codes against.

A *policy* turns prompt token ids into output token ids with the log-probability of each
sampled token. Backends: the embedded CPU engine (:mod:`sandrl.inference.engine`), an
SGLang server (:mod:`sandrl.inference.sglang`), a vLLM server (:mod:`sandrl.inference.vllm`)
and any OpenAI-compatible server (:mod:`sandrl.inference.openai`). The rollout code sees only
:class:`InferenceClient`.

Token in, token out: trajectories are token-exact, so nothing here takes or returns text
that the caller would have to re-tokenize.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, Protocol, get_args, runtime_checkable

from sandrl.errors import ConfigError
from sandrl.inference.tokenizer import Tokenizer

UpdatePolicy = Literal["in_place", "pause", "abort_and_resume"]
"""What a weight update does to requests in flight (see :mod:`sandrl.inference.engine`)."""
UPDATE_POLICIES: tuple[str, ...] = get_args(UpdatePolicy)

FinishReason = Literal["stop", "length", "abort"]
"""Why generation ended: a stop token or string, the token budget (or the context), or an abort."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion. Validated on construction (a bad value is a ConfigError)."""

    temperature: float = 1.0
    """Softmax temperature; 0 means greedy (argmax), which is deterministic."""
    top_p: float = 1.0
    """Nucleus sampling: sample only from the smallest set of tokens whose probability reaches top_p."""
    max_new_tokens: int = 128
    """Most tokens to generate; reaching it ends with finish_reason 'length'."""
    stop: tuple[str, ...] = ()
    """Stop strings: generation ends after the token that completes one of them (the token is kept)."""
    stop_token_ids: tuple[int, ...] = ()
    """Extra stop tokens, on top of the model's end-of-sequence tokens; the stop token is kept in the output."""
    seed: int | None = None
    """Seed of this request's sampler: the same seed, prompt and weights give the same output."""
    ignore_eos: bool = False
    """Do not stop at the model's end-of-sequence tokens (``stop_token_ids`` still stop); for benchmarks."""
    top_logprobs: int = 0
    """Also return, for each output position, this many most likely tokens with their log-probs."""
    scaled_logprobs: bool = False
    """Which log-probs come back. False: ``log_softmax(logits)``, temperature 1, what the trainer
    recomputes and what importance ratios need (SGLang with ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``).
    True: ``log_softmax(logits / temperature)``, the distribution sampled from before top-p (SGLang's
    default). Greedy requests (temperature 0) always get temperature-1 log-probs."""
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(token id, bias) pairs added to the logits before sampling (OpenAI's and SGLang's ``logit_bias``).
    The returned log-probs are then those of the biased distribution, the one the token was drawn from."""

    def __post_init__(self) -> None:
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ConfigError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}")
        if not math.isfinite(self.top_p) or not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.max_new_tokens < 0:
            raise ConfigError(f"max_new_tokens must be >= 0, got {self.max_new_tokens!r}")
        if not 0 <= self.top_logprobs <= 20:
            raise ConfigError(f"top_logprobs must be between 0 and 20, got {self.top_logprobs!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ConfigError(f"stop strings must be non-empty strings, got {self.stop!r}")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise ConfigError(f"stop_token_ids must be non-negative token ids, got {self.stop_token_ids!r}")
        bias = tuple((int(t), float(b)) for t, b in self.logit_bias)
        if any(t < 0 or math.isnan(b) for t, b in bias):
            raise ConfigError(f"logit_bias must map non-negative token ids to numbers, got {self.logit_bias!r}")
        object.__setattr__(self, "logit_bias", bias)
        # Lists are accepted for convenience; tuples keep the dataclass hashable and immutable.
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class Generation:
    """One completion: the sampled token ids and, for each, its log-probability under the policy.

    ``output_logprobs[i]`` is ``log softmax(logits)[output_ids[i]]`` of the raw model
    distribution (temperature 1, before top-p), which is what the trainer recomputes and
    what importance correction needs; with ``SamplingParams.scaled_logprobs`` it is taken
    at the sampling temperature instead.
    """

    output_ids: list[int]
    """The sampled tokens, stop token included (trajectories keep what the model emitted)."""
    output_logprobs: list[float]
    """Log-probability of each sampled token; same length as ``output_ids``."""
    finish_reason: FinishReason
    weight_version: int
    """Version of the weights that produced the last token (the server's version when the request finished)."""
    prompt_tokens: int
    """Length of the prompt, as the server counted it."""
    start_weight_version: int | None = None
    """Version of the weights that produced the first token; differs from ``weight_version`` only when
    a weight update landed while this request was being decoded. None when the backend does not say."""
    matched_stop: int | str | None = None
    """The stop token id or stop string that ended generation, when finish_reason is 'stop'."""
    text: str | None = None
    """The output decoded by the server, when it has a tokenizer; informational only."""
    output_top_logprobs: list[list[tuple[int, float]]] | None = field(default=None, repr=False)
    """Per output position, the ``top_logprobs`` most likely (token id, log-prob) pairs, if requested."""
    output_weight_versions: list[int] | None = field(default=None, repr=False)
    """Per output token, the version of the weights whose forward pass produced it (and its log-prob):
    exact when a weight update landed mid-generation. None when the backend does not say."""
    cached_tokens: int = 0
    """Prompt tokens whose KV the server reused from its prefix cache instead of computing them (SGLang's
    ``meta_info.cached_tokens``, OpenAI's ``usage.prompt_tokens_details.cached_tokens``); 0 when it does not say."""

    def __post_init__(self) -> None:
        if len(self.output_ids) != len(self.output_logprobs):
            raise ValueError(
                f"a Generation needs one log-prob per output token: {len(self.output_ids)} ids, "
                f"{len(self.output_logprobs)} log-probs"
            )
        if self.output_weight_versions is not None and len(self.output_weight_versions) != len(self.output_ids):
            raise ValueError(
                f"a Generation needs one weight version per output token: {len(self.output_ids)} ids, "
                f"{len(self.output_weight_versions)} versions"
            )

    def token_weight_versions(self) -> list[int | None]:
        """Per output token, its weight version: exact when the backend records it, else the start version
        for all tokens when it equals the final one, else None where it is not known."""
        if self.output_weight_versions is not None:
            return list(self.output_weight_versions)
        if self.start_weight_version in (None, self.weight_version):
            return [self.weight_version] * len(self.output_ids)
        return [None] * len(self.output_ids)

    @property
    def completion_tokens(self) -> int:
        return len(self.output_ids)


@runtime_checkable
class InferenceClient(Protocol):
    """A policy that can be sampled and whose weights can be replaced.

    Implementations: :class:`~sandrl.inference.engine.Engine` (in process),
    :class:`~sandrl.inference.sglang.SGLangClient`, :class:`~sandrl.inference.openai.OpenAIClient`,
    :class:`~sandrl.inference.vllm.VLLMClient` (several servers: one of them speaking to the router of
    :mod:`sandrl.inference.fleet`).
    """

    @property
    def tokenizer(self) -> Tokenizer | None:
        """The served model's tokenizer (what an agent renders its prompts with); None when unknown.

        The engine has its own; a client of a server is given the one of the checkpoint it serves."""
        ...

    @property
    def max_context(self) -> int | None:
        """Most tokens of prompt and output together the model takes; None when unknown."""
        ...

    async def generate(self, input_ids: list[int], params: SamplingParams) -> Generation:
        """Sample one completion of ``input_ids``. Raises InferenceError (server) or ConfigError (bad request)."""
        ...

    async def update_weights(self, path: str, *, version: int | None = None) -> int:
        """Load new weights from a checkpoint directory on the server's disk; return the new weight version.

        ``version`` is the version the new weights get (the trainer's, so every sample names the
        weights that produced it); None: the current one plus one. Requests in flight are not
        dropped: they go on with the new weights from the next decode step.
        """
        ...

    async def health(self) -> None:
        """Return if the policy can serve requests; raise InferenceError saying what to do otherwise."""
        ...


LORA_NAME_PREFIX = "sandrl-v"
"""``update_lora_adapter`` loads the adapter of version N under the name ``sandrl-vN``."""


@runtime_checkable
class LoraClient(Protocol):
    """A policy whose server loads LoRA adapters at run time and samples with them.

    Implementations: :class:`~sandrl.inference.engine.Engine` (requests name an adapter, or get the one
    :meth:`update_lora_adapter` set), :class:`~sandrl.inference.sglang.SGLangClient` (SGLang's
    ``/load_lora_adapter``, ``lora_path`` in ``/generate``), :class:`~sandrl.inference.vllm.VLLMClient`
    (vLLM's ``/v1/load_lora_adapter``, the adapter's name as ``model``).
    """

    async def load_lora_adapter(self, name: str, path: str) -> None:
        """Load the adapter directory ``path`` (on the server's disk) under ``name``."""
        ...

    async def unload_lora_adapter(self, name: str) -> None:
        """Forget the adapter ``name``."""
        ...

    async def update_lora_adapter(self, path: str, *, version: int | None = None) -> int:
        """Sample from now on with the base plus the adapter at ``path`` (``export_lora``'s ``adapter`` export);
        return its version: ``version`` (the trainer's), else the current one plus one. The twin of
        :meth:`InferenceClient.update_weights` for a policy trained with LoRA: every token sampled with the
        adapter carries its version."""
        ...
