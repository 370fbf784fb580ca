"""The embedded CPU engine: a transformers causal LM that serves many requests at once.

One background thread owns the model. Each turn of its loop it

1. swaps in new weights if an update is waiting (so an update lands *between* decode
   steps, and no request in flight is dropped: it goes on with the new weights, keeping
   the KV cache it already has, as SGLang's in-place update does),
2. admits waiting requests and prefills their prompts together (left-padded, one forward),
   merging their KV cache into the running batch's,
3. decodes one token for every running request in one forward over the shared,
   attention-masked KV cache, and
4. hands finished requests back to their callers' event loops.

This is continuous batching: requests join and leave the batch between steps, so a short
request never waits for a long one. Callers use the async :meth:`Engine.generate`, which
makes the engine an :class:`~sandrl.inference.base.InferenceClient` in its own right.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import torch
from transformers import DynamicCache

from sandrl.errors import ConfigError, InferenceError
from sandrl.inference.base import FinishReason, Generation, SamplingParams
from sandrl.inference.model import TinyModelConfig, load_model, load_weights
from sandrl.inference.sampling import RowSampler, sample_next
from sandrl.inference.tokenizer import Tokenizer

log = logging.getLogger(__name__)


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

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ConfigError(f"num_threads must be >= 1, got {self.num_threads}")
        if self.max_prefill_tokens < 1:
            raise ConfigError(f"max_prefill_tokens must be >= 1, got {self.max_prefill_tokens}")


@dataclass
class EngineStats:
    """Counters of the decode loop (read them for benchmarks and tests; they only grow)."""

    steps: int = 0
    """Decode forwards run."""
    decoded_tokens: int = 0
    """Tokens sampled in decode steps (the sum of the batch sizes)."""
    prefills: int = 0
    max_batch: int = 0
    """The largest number of requests decoded in one step."""
    weight_updates: int = 0


@dataclass(eq=False)
class _Request:
    prompt: list[int]
    params: SamplingParams
    sampler: RowSampler
    stop_ids: frozenset[int]
    max_new_tokens: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Generation]
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    start_weight_version: int | None = None
    finish: FinishReason | None = None
    matched: int | str | None = None
    cancelled: bool = False


@dataclass(eq=False)
class _WeightUpdate:
    state: dict[str, torch.Tensor]
    path: str
    version: int | None
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[int]


class Engine:
    """A causal LM with continuous batching on the CPU; start it with :meth:`load` or the constructor."""

    def __init__(
        self,
        model: Any,
        tokenizer: Tokenizer | None = None,
        *,
        config: EngineConfig | None = None,
        model_path: str = "",
    ) -> None:
        self.config = config or EngineConfig()
        self.tokenizer = tokenizer
        self.model_path = model_path
        self.stats = EngineStats()
        self._model = model.eval()
        self._vocab_size = int(model.config.vocab_size)
        self._max_context = int(getattr(model.config, "max_position_embeddings", 0) or 1 << 30)
        eos = list(tokenizer.eos_token_ids) if tokenizer is not None else _config_eos(model)
        self._eos_ids = frozenset(eos)
        # transformers 5 renamed the cache argument of forward; support both spellings.
        params = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self._keep_kwarg = "logits_to_keep" if "logits_to_keep" in params else None
        small = sum(p.numel() for p in model.parameters()) < 50_000_000
        # Intra-op threads of the engine thread (see EngineConfig.num_threads).
        self.num_threads = self.config.num_threads or (1 if small else torch.get_num_threads())
        self._rng = random.Random(self.config.seed)
        self._weight_version = 0
        self._cv = threading.Condition()
        self._waiting: deque[_Request] = deque()
        self._updates: list[_WeightUpdate] = []
        self._closing = False
        # Decode state, touched only by the engine thread.
        self._running: list[_Request] = []
        self._cache: Any = None
        self._mask = torch.zeros(0, 0, dtype=torch.long)
        self._thread = threading.Thread(target=self._run, name="sandrl-engine", daemon=True)
        self._thread.start()

    @classmethod
    def load(cls, model: str, config: EngineConfig | None = None) -> Engine:
        """Start an engine on ``tiny`` or a local checkpoint directory (never a download)."""
        cfg = config or EngineConfig()
        net, tokenizer, path = load_model(model, tiny=cfg.tiny)
        return cls(net, tokenizer, config=cfg, model_path=path)

    # -- the InferenceClient protocol ----------------------------------------------------------

    @property
    def weight_version(self) -> int:
        return self._weight_version

    @property
    def model(self) -> Any:
        """The served transformers model; read it, but change its weights only through :meth:`update_weights`."""
        return self._model

    @property
    def hf_config(self) -> Any:
        """The served model's Hugging Face config."""
        return self._model.config

    @property
    def max_context(self) -> int:
        return self._max_context

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def running(self) -> int:
        """Requests being decoded or waiting to be."""
        with self._cv:
            return len(self._running) + len(self._waiting)

    async def generate(self, input_ids: list[int], params: SamplingParams) -> Generation:
        self._check_alive()
        prompt = self._check_prompt(input_ids, params)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Generation] = loop.create_future()
        seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
        request = _Request(
            prompt=prompt,
            params=params,
            sampler=RowSampler(
                params.temperature, params.top_p, torch.Generator().manual_seed(seed), params.top_logprobs
            ),
            stop_ids=frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else self._eos_ids),
            max_new_tokens=min(params.max_new_tokens, self._max_context - len(prompt)),
            loop=loop,
            future=future,
        )
        if request.max_new_tokens == 0:
            request.finish = "length"
            return self._result(request)

        def on_done(done: asyncio.Future[Generation]) -> None:
            # The caller went away (a disconnect, a timeout): free its batch slot at the next step.
            if done.cancelled():
                request.cancelled = True

        future.add_done_callback(on_done)
        with self._cv:
            self._waiting.append(request)
            self._cv.notify()
        return await future

    async def update_weights(self, path: str, *, version: int | None = None) -> int:
        """Load the checkpoint at ``path`` and swap it in between two decode steps; return the new version.

        The checkpoint is read and checked in a worker thread while decoding goes on; only
        the copy into the live model happens on the engine thread, between steps.
        ``version`` sets the new version explicitly (SGLang's ``weight_version``); by
        default it is the current one plus one.
        """
        self._check_alive()
        state = await asyncio.to_thread(load_weights, self._model, path)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        with self._cv:
            self._updates.append(_WeightUpdate(state, path, version, loop, future))
            self._cv.notify()
        return await future

    update_weights_from_disk = update_weights

    async def health(self) -> None:
        self._check_alive()

    # -- lifecycle -------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the engine thread; requests still in flight end with finish_reason 'abort'."""
        with self._cv:
            self._closing = True
            self._cv.notify()
        if self._thread is not threading.current_thread():
            self._thread.join()

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    async def __aenter__(self) -> Engine:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # -- checks on the caller's side ---------------------------------------------------------------

    def _check_alive(self) -> None:
        if self._closing or not self._thread.is_alive():
            raise InferenceError("the inference engine is shut down; start a new one (sandrl serve inference)")

    def _check_prompt(self, input_ids: Sequence[int], params: SamplingParams) -> list[int]:
        prompt = [int(t) for t in input_ids]
        if not prompt:
            raise ConfigError("input_ids is empty: a prompt needs at least one token (e.g. the tokenizer's <|bos|>)")
        bad = next((t for t in prompt if not 0 <= t < self._vocab_size), None)
        if bad is not None:
            raise ConfigError(f"token id {bad} is outside the model's vocabulary (0-{self._vocab_size - 1})")
        if len(prompt) >= self._max_context:
            raise ConfigError(
                f"the prompt has {len(prompt)} tokens but the model's context is {self._max_context}: "
                "shorten the conversation or serve a model with a longer context"
            )
        if params.stop and self.tokenizer is None:
            raise ConfigError("stop strings need a tokenizer, and this checkpoint has none: use stop_token_ids")
        return prompt

    # -- the engine thread -------------------------------------------------------------------------

    def _run(self) -> None:
        torch.set_num_threads(self.num_threads)  # per thread: the caller's threads keep their count
        with torch.inference_mode():
            while True:
                with self._cv:
                    while not (self._closing or self._waiting or self._updates or self._running):
                        self._cv.wait()
                    if self._closing:
                        break
                    updates, self._updates = self._updates, []
                    admitted = self._admit()
                try:
                    for update in updates:
                        self._apply_update(update)
                    if admitted:
                        self._prefill(admitted)
                    if self._running:
                        self._decode()
                except Exception as exc:
                    # A failed forward loses this batch, not the engine: its requests get the
                    # error, the cache is rebuilt from the next requests.
                    log.exception("inference engine step failed")
                    error = InferenceError(f"the inference engine failed on this batch: {exc!r}")
                    for request in self._running + admitted:
                        _deliver_error(request.loop, request.future, error)
                    self._running, self._cache = [], None
                    self._mask = torch.zeros(0, 0, dtype=torch.long)
        self._abort_all()

    def _admit(self) -> list[_Request]:
        """Take waiting requests that fit in the batch and the prefill budget (called under the lock)."""
        admitted: list[_Request] = []
        longest = 0
        while self._waiting and len(self._running) + len(admitted) < self.config.max_batch_size:
            request = self._waiting[0]
            if request.cancelled:
                self._waiting.popleft()
                continue
            width = max(longest, len(request.prompt))
            if admitted and width * (len(admitted) + 1) > self.config.max_prefill_tokens:
                break
            admitted.append(self._waiting.popleft())
            longest = width
        return admitted

    def _apply_update(self, update: _WeightUpdate) -> None:
        try:
            self._model.load_state_dict(update.state, strict=True)
        except Exception as exc:
            _deliver_error(update.loop, update.future, InferenceError(f"swapping in {update.path} failed: {exc}"))
            return
        self._weight_version = update.version if update.version is not None else self._weight_version + 1
        self.model_path = update.path
        self.stats.weight_updates += 1
        _deliver(update.loop, update.future, self._weight_version)

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any) -> torch.Tensor:
        kwargs: dict[str, Any] = {self._cache_kwarg: cache}
        if self._keep_kwarg is not None:
            kwargs[self._keep_kwarg] = 1
        out = self._model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **kwargs)
        logits: torch.Tensor = out.logits[:, -1, :]
        return logits

    def _prefill(self, requests: list[_Request]) -> None:
        width = max(len(r.prompt) for r in requests)
        pad = self.tokenizer.pad_token_id if self.tokenizer is not None else 0
        ids = torch.full((len(requests), width), pad, dtype=torch.long)
        mask = torch.zeros((len(requests), width), dtype=torch.long)
        for row, request in enumerate(requests):
            # Left padding lines up every prompt's last token in the last column.
            ids[row, width - len(request.prompt) :] = torch.tensor(request.prompt)
            mask[row, width - len(request.prompt) :] = 1
        positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self._model.config)
        logits = self._forward(ids, mask, positions, cache)
        self.stats.prefills += 1
        for request in requests:
            request.start_weight_version = self._weight_version
        self._merge(requests, cache, mask)
        self._take(requests, logits)

    def _decode(self) -> None:
        rows = len(self._running)
        ids = torch.tensor([[r.output_ids[-1]] for r in self._running], dtype=torch.long)
        self._mask = torch.cat([self._mask, torch.ones((rows, 1), dtype=torch.long)], dim=1)
        positions = self._mask.sum(dim=-1, keepdim=True) - 1
        logits = self._forward(ids, self._mask, positions, self._cache)
        self.stats.steps += 1
        self.stats.decoded_tokens += rows
        self.stats.max_batch = max(self.stats.max_batch, rows)
        # The prefilled rows that finished on their first token are already gone; the
        # running list now matches the logits row for row.
        self._take(list(self._running), logits)

    def _take(self, requests: list[_Request], logits: torch.Tensor) -> None:
        """Append each request's next token (row i of ``logits`` is requests[i]) and retire the finished."""
        sampled = sample_next(logits, [r.sampler for r in requests])
        for i, request in enumerate(requests):
            token = sampled.token_ids[i]
            request.output_ids.append(token)
            request.output_logprobs.append(sampled.logprobs[i])
            top = sampled.top_logprobs[i]
            if top is not None:
                request.top_logprobs.append(top)
            self._check_finished(request, token)
        done = [r for r in self._running if r.finish is not None or r.cancelled]
        if not done:
            return
        keep = [i for i, r in enumerate(self._running) if r.finish is None and not r.cancelled]
        self._select(keep)
        for request in done:
            if not request.cancelled:
                _deliver(request.loop, request.future, self._result(request))

    def _check_finished(self, request: _Request, token: int) -> None:
        if token in request.stop_ids:
            request.finish, request.matched = "stop", token
        elif request.params.stop and self.tokenizer is not None:
            # Only the tail can hold a stop string that this token completed: earlier ones would
            # have stopped generation already. Every token is at least one byte long.
            span = max(len(s.encode()) for s in request.params.stop) + 4
            tail = self.tokenizer.decode(request.output_ids[-span:])
            matched = next((s for s in request.params.stop if s in tail), None)
            if matched is not None:
                request.finish, request.matched = "stop", matched
        if request.finish is None and len(request.output_ids) >= request.max_new_tokens:
            request.finish = "length"

    # -- the shared KV cache -----------------------------------------------------------------------

    def _merge(self, requests: list[_Request], cache: Any, mask: torch.Tensor) -> None:
        """Append freshly prefilled rows to the running batch, left-padding the shorter side's cache."""
        if not self._running:
            self._running, self._cache, self._mask = list(requests), cache, mask
            return
        width = max(self._mask.shape[1], mask.shape[1])
        for old, new in zip(self._cache.layers, cache.layers, strict=True):
            old.keys = torch.cat([_pad_left(old.keys, width), _pad_left(new.keys, width)], dim=0)
            old.values = torch.cat([_pad_left(old.values, width), _pad_left(new.values, width)], dim=0)
        self._mask = torch.cat([_pad_left(self._mask, width), _pad_left(mask, width)], dim=0)
        self._running += requests

    def _select(self, keep: list[int]) -> None:
        """Keep only the rows ``keep`` of the running batch, and drop columns that are padding in every row."""
        self._running = [self._running[i] for i in keep]
        if not keep:
            self._cache, self._mask = None, torch.zeros(0, 0, dtype=torch.long)
            return
        index = torch.tensor(keep, dtype=torch.long)
        mask = self._mask.index_select(0, index)
        first = int(mask.any(dim=0).nonzero()[0])
        self._mask = mask[:, first:]
        for layer in self._cache.layers:
            layer.keys = layer.keys.index_select(0, index)[:, :, first:]
            layer.values = layer.values.index_select(0, index)[:, :, first:]

    def _abort_all(self) -> None:
        with self._cv:
            pending = self._running + list(self._waiting)
            self._running, self._waiting = [], deque()
            updates, self._updates = self._updates, []
        for request in pending:
            request.finish = request.finish or "abort"
            _deliver(request.loop, request.future, self._result(request))
        for update in updates:
            _deliver_error(
                update.loop, update.future, InferenceError("the inference engine shut down before the update")
            )

    def _result(self, request: _Request) -> Generation:
        assert request.finish is not None
        text = None
        if self.tokenizer is not None:
            text = self.tokenizer.decode(request.output_ids, skip_special_tokens=True)
        return Generation(
            output_ids=list(request.output_ids),
            output_logprobs=list(request.output_logprobs),
            finish_reason=request.finish,
            weight_version=self._weight_version,
            prompt_tokens=len(request.prompt),
            start_weight_version=request.start_weight_version,
            matched_stop=request.matched,
            text=text,
            output_top_logprobs=list(request.top_logprobs) if request.params.top_logprobs else None,
        )


def _pad_left(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """Zero-pad dimension 2 (KV cache [batch, heads, seq, dim]) or 1 (mask [batch, seq]) on the left to ``width``."""
    dim = 2 if tensor.dim() == 4 else 1
    missing = width - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


def _config_eos(model: Any) -> list[int]:
    eos = getattr(model.config, "eos_token_id", None)
    if eos is None:
        return []
    return [int(eos)] if isinstance(eos, int) else [int(e) for e in eos]


def _deliver(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], value: Any) -> None:
    def resolve() -> None:
        if not future.done():
            future.set_result(value)

    # A closed event loop means nobody waits for this result any more.
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(resolve)


def _deliver_error(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], error: BaseException) -> None:
    def resolve() -> None:
        if not future.done():
            future.set_exception(error)

    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(resolve)
