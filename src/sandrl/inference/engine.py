"""The embedded CPU engine: a transformers causal LM that serves many requests at once.

One background thread owns the model. Each turn of its loop it

1. retires aborted requests and applies pause / continue,
2. swaps in new weights if an update is waiting, as its policy says (below),
3. admits waiting requests and prefills their prompts together (left-padded, one forward, each
   after its cached prefix: :mod:`~sandrl.inference.prefix_cache`), merging their KV into the batch's,
4. decodes one token for every running request in one forward over the shared,
   attention-masked KV cache, and
5. hands finished requests back to their callers' event loops.

This is continuous batching: requests join and leave the batch between steps, so a short
request never waits for a long one. Callers use the async :meth:`Engine.generate`, which
makes the engine an :class:`~sandrl.inference.base.InferenceClient` in its own right.

Every token records the weight version of the forward pass that produced it
(``Generation.output_weight_versions``), so a generation that spans a weight update says
exactly which tokens came from which weights. What an update does to requests in flight is
the engine's ``update_policy`` (or the update's own), in the words SGLang uses:

- ``in_place``: swap between two decode steps; requests go on with the new weights over the
  KV cache the old ones built (SGLang's ``pause_generation(mode="in_place")`` + update).
- ``pause``: admit nothing new, let the running requests finish on the old weights, then swap
  (SGLang's default: its update waits for in-flight requests).
- ``abort_and_resume``: retract the running requests (drop their KV cache), swap, and prefill
  each again from its prompt and the tokens it already has, so it resumes as a continuation
  under the new weights (SGLang's ``mode="retract"``): a partial rollout, not a lost one.

LoRA adapters are served unmerged, each request with its own (:mod:`sandrl.inference.lora_rows`).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import threading
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from types import TracebackType
from typing import Any

import torch
from transformers import DynamicCache

from sandrl.errors import ConfigError, InferenceError
from sandrl.inference.base import FinishReason, Generation, SamplingParams
from sandrl.inference.batch import (
    PAUSE_MODES,
    Control,
    Partial,
    PauseMode,
    Request,
    RunningBatch,
    WeightUpdate,
    admit,
    check_prompt,
    deliver,
    deliver_error,
)
from sandrl.inference.engine_config import EngineConfig as EngineConfig
from sandrl.inference.engine_config import EngineStats as EngineStats
from sandrl.inference.engine_memory import EngineMemory
from sandrl.inference.engine_weights import EngineWeights
from sandrl.inference.kv_budget import KVBudget
from sandrl.inference.kv_capacity import KVCapacity
from sandrl.inference.lora_adapter import LoraAdapter
from sandrl.inference.lora_registry import AdapterRegistry
from sandrl.inference.lora_rows import AdapterRows
from sandrl.inference.model import config_eos_ids, load_model
from sandrl.inference.prefix_cache import PrefixCache, defer_sharers, note_prefill, prefill_inputs
from sandrl.inference.sampling import RowSampler, sample_next
from sandrl.inference.tokenizer import Tokenizer

log = logging.getLogger(__name__)


class Engine(EngineWeights, EngineMemory):
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
        eos = list(tokenizer.eos_token_ids) if tokenizer is not None else config_eos_ids(model)
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
        # Shared with callers' threads, under the lock.
        self._cv = threading.Condition()
        self._waiting: deque[Request] = deque()
        self._inflight: set[Request] = set()
        self._updates: list[WeightUpdate] = []
        self._controls: list[Control] = []
        self._paused = False
        self._wake = False
        self._closing = False
        self._adapters = AdapterRegistry(self.config.max_loras)
        self._max_rank = self.config.max_lora_rank
        # Decode state, touched only by the engine thread.
        self._policy_adapter: LoraAdapter | None = None
        self._rows = AdapterRows(model)
        self._batch = RunningBatch()
        self.prefix_cache = PrefixCache(self.config.prefix_cache_tokens, DynamicCache(config=model.config))
        self.kv_budget = KVBudget(self.config.kv_cache_tokens)
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
            return len(self._inflight)

    @property
    def paused(self) -> bool:
        """Whether :meth:`pause` stopped generation (until :meth:`continue_generation`)."""
        return self._paused

    async def generate(
        self, input_ids: list[int], params: SamplingParams, *, rid: str | None = None, lora: str | None = None
    ) -> Generation:
        """Sample one completion; ``rid`` names the request for :meth:`abort` (default: a fresh id).

        ``lora``: the name of a loaded adapter (:meth:`load_lora_adapter`) to sample with, over the base
        weights; None: the served model (the base, plus :attr:`lora_adapter` when one is set)."""
        request = self._submit(input_ids, params, rid, None, lora)
        if request.finish is not None:
            return request.future.result()
        return await request.future

    async def stream(
        self, input_ids: list[int], params: SamplingParams, *, rid: str | None = None, lora: str | None = None
    ) -> AsyncIterator[Partial | Generation]:
        """Like :meth:`generate`, but yield the output so far after each token, then the finished Generation.

        A reader slower than the engine gets the latest output when it asks (tokens coalesce).

        Leaving the loop early (a client that disconnects) frees the request's batch slot.
        """
        counts: asyncio.Queue[int] = asyncio.Queue()
        request = self._submit(input_ids, params, rid, counts.put_nowait, lora)
        try:
            while not request.future.done():
                waiter: asyncio.Future[Any] = asyncio.ensure_future(counts.get())
                pending: set[asyncio.Future[Any]] = {waiter, request.future}
                await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if not waiter.done():
                    waiter.cancel()
                    break
                n = waiter.result()
                while not counts.empty():  # a slow reader gets the latest output, not a backlog (as SGLang's)
                    n = counts.get_nowait()
                if request.future.done():
                    break  # the finished Generation follows, with the same tokens
                yield request.partial(n)
            yield await request.future
        finally:
            if not request.future.done():
                request.cancelled = True
                request.future.cancel()

    async def health(self) -> None:
        self._check_alive()

    async def kv_capacity(self) -> KVCapacity:
        """The engine's load and KV room now, what ``/v1/loads`` answers (:mod:`~sandrl.inference.kv_budget`)."""
        with self._cv:
            queued = len(self._waiting)
        # The engine thread's list, copied whole (one step under the GIL): a reading, not a lock on the loop.
        return self.kv_budget.reading(list(self._batch.requests), queued, self.config.max_batch_size)

    # -- control: abort, pause, continue (SGLang's /abort_request, /pause_generation, ...) ----------

    def abort(self, rid: str | None = None) -> int:
        """End the request ``rid`` (all requests when None) with finish_reason 'abort' and the tokens it has.

        Returns how many requests were aborted; an unknown or finished ``rid`` aborts nothing.
        """
        with self._cv:
            hit = [r for r in self._inflight if (rid is None or r.rid == rid) and not r.leaving]
            for request in hit:
                request.aborted = True
                if request in self._waiting:
                    self._waiting.remove(request)
                    self._finish(request, "abort")
            self._wake = True
            self._cv.notify()
        return len(hit)

    async def pause(self, mode: PauseMode = "abort") -> None:
        """Stop generating until :meth:`continue_generation`; new requests queue meanwhile (SGLang's pause modes).

        ``abort``: requests in flight end now with finish_reason 'abort'. ``retract``: they drop
        their KV cache and wait to be prefilled again, with the tokens they have, when generation
        continues. ``in_place``: they keep their KV cache and go on where they stopped.
        """
        if mode not in PAUSE_MODES:
            raise ConfigError(f"unknown pause mode {mode!r}; use one of {', '.join(PAUSE_MODES)}")
        await self._control(mode)

    async def continue_generation(self) -> None:
        await self._control("continue")

    async def flush_cache(self) -> None:
        """Empty the prefix cache (SGLang's /flush_cache); running requests keep their own KV."""
        await self._control("flush")

    async def set_weight_version(self, version: int) -> None:
        """Rename the current weights' version (SGLang's /update_weight_version); tokens sampled after it carry it."""
        await self._control("version", version)

    # -- lifecycle -------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the engine thread; requests still in flight end with finish_reason 'abort'."""
        with self._cv:
            self._closing = True
            self._cv.notify()
        if self._thread is not threading.current_thread():
            self._thread.join()
        if self._receiver is not None:
            self._receiver.close()

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    async def __aenter__(self) -> Engine:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # -- the caller's side ----------------------------------------------------------------------------

    def _submit(
        self,
        input_ids: list[int],
        params: SamplingParams,
        rid: str | None,
        on_token: Callable[[int], None] | None,
        lora: str | None,
    ) -> Request:
        self._check_alive()
        prompt = self.check_prompt(input_ids, params)
        with self._cv:
            adapter = self._adapters.get(lora) if lora is not None else None
        loop = asyncio.get_running_loop()
        seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
        request = Request(
            rid=rid or uuid.uuid4().hex,
            prompt=prompt,
            params=params,
            sampler=RowSampler(
                params.temperature,
                params.top_p,
                torch.Generator().manual_seed(seed),
                params.top_logprobs,
                params.logit_bias,
                params.scaled_logprobs,
            ),
            stop_ids=frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else self._eos_ids),
            max_new_tokens=min(
                params.max_new_tokens, self._max_context - len(prompt), self.kv_budget.room_for(len(prompt))
            ),
            loop=loop,
            future=loop.create_future(),
            on_token=on_token,
            adapter=adapter,
        )
        if request.max_new_tokens == 0:
            request.finish = "length"
            request.future.set_result(request.result(self._weight_version, self._text(request)))
            return request

        def on_done(done: asyncio.Future[Generation]) -> None:
            # The caller went away (a disconnect, a timeout): free its batch slot at the next step.
            if done.cancelled():
                request.cancelled = True

        request.future.add_done_callback(on_done)
        with self._cv:
            self._inflight.add(request)
            self._waiting.append(request)
            self._cv.notify()
        return request

    async def _control(self, action: str, value: int | None = None) -> None:
        self._check_alive()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        with self._cv:
            self._controls.append(Control(action, value, loop, future))
            self._cv.notify()
        await future

    def _check_alive(self) -> None:
        if self._closing or not self._thread.is_alive():
            raise InferenceError("the inference engine is shut down; start a new one (sandrl serve inference)")

    def check_prompt(self, input_ids: Sequence[int], params: SamplingParams) -> list[int]:
        """The prompt as a list of ints, or a ConfigError saying why the engine cannot take it."""
        return check_prompt(input_ids, params, self._vocab_size, self._max_context, self.tokenizer is not None)

    # -- the engine thread -------------------------------------------------------------------------

    def _has_work(self) -> bool:
        return bool(
            self._closing
            or self._controls
            or self._updates
            or self._wake
            or (not self._paused and (self._waiting or self._batch))
        )

    def _run(self) -> None:
        torch.set_num_threads(self.num_threads)  # per thread: the caller's threads keep their count
        with torch.inference_mode():
            while True:
                with self._cv:
                    while not self._has_work():
                        self._cv.wait()
                    if self._closing:
                        break
                    self._wake = False
                    controls, self._controls = self._controls, []
                admitted: list[Request] = []
                try:
                    self._retire(self._batch.remove_leaving())
                    for control in controls:
                        self._apply_control(control)
                    if self._apply_updates() and not self._paused:
                        with self._cv:
                            admitted = self._admit()
                        if admitted:
                            self._prefill(admitted)
                    if self._batch and not self._paused:
                        self._make_room()
                        self._decode()
                except Exception as exc:
                    # A failed forward loses this batch, not the engine: its requests get the
                    # error, the cache is rebuilt from the next requests.
                    log.exception("inference engine step failed")
                    error = InferenceError(f"the inference engine failed on this batch: {exc!r}")
                    failed = self._batch.clear() + admitted
                    with self._cv:
                        self._inflight.difference_update(failed)
                    for request in failed:
                        deliver_error(request.loop, request.future, error)
        self._abort_all()

    def _apply_control(self, control: Control) -> None:
        if control.action == "abort":
            with self._cv:
                waiting, self._waiting = list(self._waiting), deque()
            for request in self._batch.clear() + waiting:
                self._finish(request, "abort")
        elif control.action == "retract":
            self._retract()
        elif control.action == "version" and control.value is not None:
            self._weight_version = control.value
        elif control.action == "flush":
            self.prefix_cache.clear()
        self._paused = control.action in PAUSE_MODES or (self._paused and control.action in ("version", "flush"))
        deliver(control.loop, control.future, 0)

    def _apply_updates(self) -> bool:
        """Swap in the updates whose policy allows it now; False while one waits for running requests (``pause``)."""
        while True:
            with self._cv:
                if not self._updates:
                    return True
                update = self._updates[0]
                if update.policy == "pause" and self._batch and not self._paused:
                    return False  # running requests finish on the old weights; nothing new is admitted
                self._updates.pop(0)
            if update.policy == "abort_and_resume" and not self._paused:
                self._retract()
            self._swap(update)

    def _retract(self) -> None:
        """Drop the running requests' KV cache and queue them first, to be prefilled again with their output."""
        # Shortest first, so that each prefill that takes them back pads little (see _admit).
        requests = sorted(self._batch.clear(), key=lambda r: len(r.context))
        for request in requests:
            request.retractions += 1
        with self._cv:
            self._waiting.extendleft(reversed(requests))

    def _admit(self) -> list[Request]:
        """Take waiting requests that fit in the batch and the prefill budget (called under the lock)."""
        room = self.kv_budget.admissible(
            self._waiting, self._batch.requests, self.config.max_batch_size - len(self._batch)
        )
        admitted, cancelled = admit(self._waiting, room, self.config.max_prefill_tokens, self.prefix_cache.uncached)
        self._inflight.difference_update(cancelled)
        admitted, later = defer_sharers(admitted, self.prefix_cache)
        self._waiting.extendleft(reversed(later))  # next step, after the KV they share is cached
        return admitted

    def _make_room(self) -> None:
        """Retract the newest running requests whose next tokens would not fit the KV bound (``kv_cache_tokens``)."""
        retracted = self.kv_budget.retract_overflow(self._batch)
        if retracted:
            self.stats.kv_retractions += len(retracted)
            with self._cv:
                self._waiting.extendleft(reversed(retracted))

    def _forward(
        self, requests: list[Request], ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        kwargs: dict[str, Any] = {self._cache_kwarg: cache}
        if self._keep_kwarg is not None:
            kwargs[self._keep_kwarg] = 1
        # Each row with its own adapter: the one it named, else the served one (update_lora_adapter's), else none.
        with self._rows.applied([r.adapter or self._policy_adapter for r in requests]):
            out = self._model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **kwargs)
        logits: torch.Tensor = out.logits[:, -1, :]
        return logits

    def _prefill(self, requests: list[Request]) -> None:
        hits = [self.prefix_cache.lookup(r) for r in requests]
        pad = self.tokenizer.pad_token_id if self.tokenizer is not None else 0
        cache = DynamicCache(config=self._model.config)
        # Left padding lines up every prompt's last token in the last column.
        ids, mask, positions = prefill_inputs([r.context for r in requests], hits, pad, cache)
        logits = self._forward(requests, ids, mask, positions, cache)
        self.stats.prefills += 1
        note_prefill(requests, hits, self.prefix_cache.epoch, self.stats)
        self.prefix_cache.store_prefilled(requests, cache, mask)
        for request in requests:
            if request.start_weight_version is None:
                request.start_weight_version = self._weight_version
        self._batch.merge(requests, cache, mask)
        self._take(requests, logits)

    def _decode(self) -> None:
        batch = self._batch
        rows = len(batch)
        ids = torch.tensor([[r.output_ids[-1]] for r in batch.requests], dtype=torch.long)
        batch.mask = torch.cat([batch.mask, torch.ones((rows, 1), dtype=torch.long)], dim=1)
        positions = batch.mask.sum(dim=-1, keepdim=True) - 1
        logits = self._forward(batch.requests, ids, batch.mask, positions, batch.cache)
        self.stats.steps += 1
        self.stats.decoded_tokens += rows
        self.stats.max_batch = max(self.stats.max_batch, rows)
        # The prefilled rows that finished on their first token are already gone; the
        # running list now matches the logits row for row.
        self._take(list(batch.requests), logits)

    def _take(self, requests: list[Request], logits: torch.Tensor) -> None:
        """Append each request's next token (row i of ``logits`` is requests[i]) and retire the finished."""
        sampled = sample_next(logits, [r.sampler for r in requests])
        for i, request in enumerate(requests):
            token = sampled.token_ids[i]
            request.output_ids.append(token)
            request.output_logprobs.append(sampled.logprobs[i])
            request.weight_versions.append(self._weight_version)
            top = sampled.top_logprobs[i]
            if top is not None:
                request.top_logprobs.append(top)
            request.check_finished(token, self.tokenizer)
            if request.finish is None:  # the last token comes with the finished Generation instead
                request.notify()
        self.prefix_cache.store_finished(self._batch)
        self._retire(self._batch.remove_leaving())

    def _retire(self, requests: list[Request]) -> None:
        for request in requests:
            if request.cancelled:
                with self._cv:
                    self._inflight.discard(request)
            else:
                self._finish(request, request.finish or "abort")

    def _finish(self, request: Request, reason: FinishReason) -> None:
        request.finish = request.finish or reason
        with self._cv:
            self._inflight.discard(request)
        deliver(request.loop, request.future, request.result(self._weight_version, self._text(request)))

    def _text(self, request: Request) -> str | None:
        if self.tokenizer is None:
            return None
        return self.tokenizer.decode(request.output_ids, skip_special_tokens=True)

    def _abort_all(self) -> None:
        with self._cv:
            pending = self._batch.clear() + list(self._waiting)
            self._waiting = deque()
            updates, self._updates = self._updates, []
            controls, self._controls = self._controls, []
        for request in pending:
            self._finish(request, "abort")
        error = InferenceError("the inference engine shut down before this could be done")
        for item in [*updates, *controls]:
            assert isinstance(item, WeightUpdate | Control)
            deliver_error(item.loop, item.future, error)
