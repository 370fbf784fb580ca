"""The engine's requests and the running batch that shares one KV cache.

A :class:`Request` is everything the engine thread knows of one generation: its prompt,
sampler, the tokens so far with their log-probs and the weight version of each, and how
the caller hears of progress. :class:`RunningBatch` holds the requests being decoded and
their left-padded, attention-masked KV cache; requests join it after their prefill and
leave it when they finish, are aborted, or are retracted (their cache dropped so they can
be prefilled again, with the tokens they already have, under new weights).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import torch

from sandrl.errors import ConfigError
from sandrl.inference.base import FinishReason, Generation, SamplingParams, UpdatePolicy
from sandrl.inference.lora_adapter import LoraAdapter
from sandrl.inference.sampling import RowSampler
from sandrl.inference.tokenizer import Tokenizer

PauseMode = Literal["abort", "retract", "in_place"]
"""SGLang's ``/pause_generation`` modes: end the requests in flight, drop their KV cache to rebuild it
later, or keep it."""
PAUSE_MODES: tuple[str, ...] = get_args(PauseMode)
MAX_PADDING = 1.5
"""A prefill admits no request that would pad it past this times its real tokens."""


@dataclass(frozen=True)
class Partial:
    """A streamed request's output so far (it has not finished)."""

    output_ids: list[int]
    output_logprobs: list[float]
    output_weight_versions: list[int]
    output_top_logprobs: list[list[tuple[int, float]]] | None
    cached_tokens: int = 0
    """Prompt tokens whose KV came from the prefix cache (:mod:`sandrl.inference.prefix_cache`)."""


@dataclass(eq=False)
class WeightUpdate:
    """New weights (``state``), or the adapter to serve over the base (``adapter``), and who waits for the swap."""

    state: dict[str, torch.Tensor] | None
    path: str
    version: int | None
    policy: UpdatePolicy
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[int]
    adapter: LoraAdapter | None = None
    owned: bool = False
    """``state``'s tensors belong to the update alone (received by broadcast): the model takes them as they are,
    with no copy."""


@dataclass(eq=False)
class Control:
    """A pause mode, ``continue``, or ``version`` (rename the current weights to ``value``)."""

    action: str
    value: int | None
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[int]


@dataclass(eq=False)
class Request:
    rid: str
    prompt: list[int]
    params: SamplingParams
    sampler: RowSampler
    stop_ids: frozenset[int]
    max_new_tokens: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Generation]
    on_token: Callable[[int], None] | None = None
    """Called on the caller's loop with the number of tokens so far after each new token (streaming)."""
    adapter: LoraAdapter | None = None
    """The LoRA adapter the request named (SGLang's ``lora_path``); None: the engine's served one."""
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    weight_versions: list[int] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    start_weight_version: int | None = None
    finish: FinishReason | None = None
    matched: int | str | None = None
    cancelled: bool = False
    """The caller went away: drop the request without an answer."""
    aborted: bool = False
    """Someone aborted it: end it with finish_reason 'abort' and what it has so far."""
    retractions: int = 0
    """Times its KV cache was dropped and rebuilt from prompt + output (abort_and_resume, pause mode retract)."""
    cached_tokens: int = 0
    """Prompt tokens its first prefill took from the prefix cache instead of computing them."""
    kv_epoch: int = -1
    """The prefix cache's epoch at its last prefill: its KV is stored only if no weight swap came since."""

    @property
    def context(self) -> list[int]:
        """What a prefill of this request feeds the model: the prompt and, after a retraction, its output so far."""
        return self.prompt + self.output_ids

    @property
    def leaving(self) -> bool:
        return self.finish is not None or self.cancelled or self.aborted

    def check_finished(self, token: int, tokenizer: Tokenizer | None) -> None:
        """Set ``finish`` if ``token`` (just appended) ends the request: a stop token or string, or the budget."""
        if token in self.stop_ids:
            self.finish, self.matched = "stop", token
        elif self.params.stop and tokenizer is not None:
            # Only the tail can hold a stop string that this token completed: earlier ones would
            # have stopped generation already. Every token is at least one byte long.
            span = max(len(s.encode()) for s in self.params.stop) + 4
            tail = tokenizer.decode(self.output_ids[-span:])
            matched = next((s for s in self.params.stop if s in tail), None)
            if matched is not None:
                self.finish, self.matched = "stop", matched
        if self.finish is None and len(self.output_ids) >= self.max_new_tokens:
            self.finish = "length"

    def notify(self) -> None:
        if self.on_token is not None:
            deliver_call(self.loop, self.on_token, len(self.output_ids))

    def partial(self, n: int) -> Partial:
        """The first ``n`` tokens of the output (a streamed request's progress)."""
        top = self.top_logprobs[:n] if self.params.top_logprobs else None
        return Partial(self.output_ids[:n], self.output_logprobs[:n], self.weight_versions[:n], top, self.cached_tokens)

    def result(self, weight_version: int, text: str | None) -> Generation:
        assert self.finish is not None
        return Generation(
            output_ids=list(self.output_ids),
            output_logprobs=list(self.output_logprobs),
            finish_reason=self.finish,
            weight_version=weight_version,
            prompt_tokens=len(self.prompt),
            start_weight_version=self.start_weight_version,
            matched_stop=self.matched,
            text=text,
            output_top_logprobs=list(self.top_logprobs) if self.params.top_logprobs else None,
            output_weight_versions=list(self.weight_versions),
            cached_tokens=self.cached_tokens,
        )


class RunningBatch:
    """The requests being decoded, row for row, with their shared KV cache and attention mask."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.cache: Any = None
        self.mask = torch.zeros(0, 0, dtype=torch.long)

    def __len__(self) -> int:
        return len(self.requests)

    def __bool__(self) -> bool:
        return bool(self.requests)

    def merge(self, requests: list[Request], cache: Any, mask: torch.Tensor) -> None:
        """Append freshly prefilled rows, left-padding the shorter side's cache."""
        if not self.requests:
            self.requests, self.cache, self.mask = list(requests), cache, mask
            return
        width = max(self.mask.shape[1], mask.shape[1])
        for old, new in zip(self.cache.layers, cache.layers, strict=True):
            old.keys = torch.cat([pad_left(old.keys, width), pad_left(new.keys, width)], dim=0)
            old.values = torch.cat([pad_left(old.values, width), pad_left(new.values, width)], dim=0)
        self.mask = torch.cat([pad_left(self.mask, width), pad_left(mask, width)], dim=0)
        self.requests += requests

    def select(self, keep: list[int]) -> None:
        """Keep only the rows ``keep``, and drop columns that are padding in every row."""
        self.requests = [self.requests[i] for i in keep]
        if not keep:
            self.clear()
            return
        index = torch.tensor(keep, dtype=torch.long)
        mask = self.mask.index_select(0, index)
        first = int(mask.any(dim=0).nonzero()[0])
        self.mask = mask[:, first:]
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, index)[:, :, first:]
            layer.values = layer.values.index_select(0, index)[:, :, first:]

    def remove_leaving(self) -> list[Request]:
        """Take out the finished, cancelled and aborted rows; return them."""
        done = [r for r in self.requests if r.leaving]
        if done:
            self.select([i for i, r in enumerate(self.requests) if not r.leaving])
        return done

    def clear(self) -> list[Request]:
        """Drop every row and the cache; return the requests that were running."""
        requests, self.requests = self.requests, []
        self.cache, self.mask = None, torch.zeros(0, 0, dtype=torch.long)
        return requests


def admit(
    waiting: deque[Request], room: int, max_prefill_tokens: int, size: Callable[[Request], int] | None = None
) -> tuple[list[Request], list[Request]]:
    """Take from ``waiting`` the requests of the next prefill: at most ``room``, within the prefill budget.

    ``size``: the tokens a request's prefill computes (default: its whole context; less with a cached prefix).
    Returns them and the cancelled requests dropped on the way.
    """
    admitted: list[Request] = []
    cancelled: list[Request] = []
    longest = real = 0
    while waiting and len(admitted) < room:
        request = waiting[0]
        if request.cancelled:
            cancelled.append(waiting.popleft())
            continue
        tokens = size(request) if size is not None else len(request.context)
        width = max(longest, tokens)
        padded = width * (len(admitted) + 1)
        # A prefill is one left-padded rectangle: past MAX_PADDING x its real tokens, padding costs
        # more than a second forward (retracted requests of any length come back together).
        if admitted and (padded > max_prefill_tokens or padded > MAX_PADDING * (real + tokens)):
            break
        admitted.append(waiting.popleft())
        longest, real = width, real + tokens
    return admitted, cancelled


def check_prompt(
    input_ids: Sequence[int], params: SamplingParams, vocab_size: int, max_context: int, has_tokenizer: bool
) -> list[int]:
    """The prompt as a list of ints, or a ConfigError saying why an engine of this model cannot take it."""
    prompt = [int(t) for t in input_ids]
    if not prompt:
        raise ConfigError("input_ids is empty: a prompt needs at least one token (e.g. the tokenizer's <|bos|>)")
    bad = next((t for t in prompt if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise ConfigError(f"token id {bad} is outside the model's vocabulary (0-{vocab_size - 1})")
    if len(prompt) >= max_context:
        raise ConfigError(
            f"the prompt has {len(prompt)} tokens but the model's context is {max_context}: "
            "shorten the conversation or serve a model with a longer context"
        )
    if params.stop and not has_tokenizer:
        raise ConfigError("stop strings need a tokenizer, and this checkpoint has none: use stop_token_ids")
    return prompt


def pad_left(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """Zero-pad dimension 2 (KV cache [batch, heads, seq, dim]) or 1 (mask [batch, seq]) on the left to ``width``."""
    dim = 2 if tensor.dim() == 4 else 1
    missing = width - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


def deliver(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], value: Any) -> None:
    def resolve() -> None:
        if not future.done():
            future.set_result(value)

    # A closed event loop means nobody waits for this result any more.
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(resolve)


def deliver_error(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], error: BaseException) -> None:
    def resolve() -> None:
        if not future.done():
            future.set_exception(error)

    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(resolve)


def deliver_call(loop: asyncio.AbstractEventLoop, callback: Callable[[int], None], value: int) -> None:
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback, value)
