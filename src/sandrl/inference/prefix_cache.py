"""The embedded engine's prefix cache: the KV of recent sequences, reused by the requests that extend them.

Turn k + 1 of a multi-turn episode is turn k's prompt, the model's reply and the next observation
(:mod:`sandrl.inference.chat` never re-renders a conversation), so without a cache every turn
prefills its whole history again. The cache keeps, for each request that finished, the keys and
values of its tokens (prompt and output, all but the last output token, which no forward has seen),
and a new request whose context shares a prefix with one of them prefills only the rest: one
forward over its suffix, attending to the cached keys and values. What SGLang's radix cache does;
what it reports as ``cached_tokens`` is :attr:`Request.cached_tokens`.

Simpler than a radix tree, on purpose: a bounded list of sequences in LRU order, each with its own
KV. A sequence that extends a stored one replaces it (its KV covers the older one's), so an episode
holds one entry whatever its number of turns; the samples of one prompt hold one entry each (their
shared prompt is stored once per sample: the price of not sharing tensors between entries). The
budget counts the tokens of all entries; past it, or past :data:`MAX_ENTRIES`, the least recently
used go. A lookup compares token lists (in C, by halving), cheap next to a forward.

KV computed by other weights is never reused: every weight swap (a full checkpoint or a new served
adapter) empties the cache and starts a new *epoch*, and a request stores its KV only if all of it
came from the current epoch (under ``in_place`` a request decoded across a swap holds KV of both).
Requests that name a LoRA adapter (``lora_path``) neither read nor write the cache: their KV is
the adapter's. Models whose cache layers are not plain full-attention layers (sliding windows) get
no cache.

Numerics: a reused prefix gives the same tokens and log-probs as a full prefill up to the float
summation order, the same tolerance as batching with other requests (``tests/inference``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from sandrl.inference.batch import Request, RunningBatch, pad_left
from sandrl.inference.engine_config import EngineStats

MAX_ENTRIES = 1024
"""Most sequences held: each lookup compares the request with every entry."""

KV = tuple[torch.Tensor, torch.Tensor]
"""One layer's keys and values, ``[1, kv_heads, tokens, head_dim]``."""


@dataclass(eq=False)
class _Entry:
    tokens: list[int]
    layers: list[KV]


@dataclass(frozen=True)
class Hit:
    """The first ``length`` tokens of a request's context, whose KV the cache holds (``layers``, longer)."""

    length: int
    layers: list[KV]


class PrefixCache:
    """Sequences' KV by their tokens, at most ``max_tokens`` tokens in all; 0 turns the cache off.

    Only the engine thread calls it; the counters may be read from anywhere."""

    def __init__(self, max_tokens: int, empty_cache: Any) -> None:
        layers: list[Any] = list(getattr(empty_cache, "layers", None) or ())
        # Only a full-attention layer keeps every position: a sliding window's KV is not a prefix's.
        plain = bool(layers) and all(type(layer).__name__ == "DynamicLayer" for layer in layers)
        self.max_tokens = max_tokens if plain else 0
        self.epoch = 0
        """Bumped by :meth:`clear`: KV of an older epoch is never stored."""
        self.tokens = 0
        """Tokens held, over all entries."""
        self.evictions = 0
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._next = 0

    @property
    def entries(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Drop every entry (new weights, or ``/flush_cache``) and start a new epoch."""
        self._entries.clear()
        self.tokens = 0
        self.epoch += 1

    def uncached(self, request: Request) -> int:
        """The tokens of ``request``'s context a prefill must compute (what admission budgets)."""
        context = request.context
        return len(context) - self._match(request, context)[0]

    def lookup(self, request: Request) -> Hit | None:
        """The longest cached prefix of ``request``'s context (marked recently used), None when there is none.

        At least the context's last token is left to compute: its logits give the first new token."""
        length, key = self._match(request, request.context)
        if key is None:
            return None
        self._entries.move_to_end(key)
        return Hit(length, self._entries[key].layers)

    def store_prefilled(self, requests: Sequence[Request], cache: Any, mask: torch.Tensor) -> None:
        """Keep the KV a prefill just computed for each request's whole context, so that the requests admitted
        after it that share the prompt (a group's samples, a burst of episodes under one system prompt) prefill
        only what differs (:func:`defer_sharers` holds them back one step for that)."""
        if not self.max_tokens:
            return
        for row, request in enumerate(requests):
            if request.adapter is not None or request.kv_epoch != self.epoch:
                continue
            columns = mask[row].nonzero().squeeze(1)
            if len(columns) != len(request.context):
                continue
            keep = [(layer.keys[row : row + 1], layer.values[row : row + 1]) for layer in cache.layers]
            layers = [(k.index_select(2, columns), v.index_select(2, columns)) for k, v in keep]
            self.insert(list(request.context), layers)

    def store_finished(self, batch: RunningBatch) -> None:
        """Keep the KV of the batch's rows that just finished, before they leave the batch."""
        if not self.max_tokens:
            return
        for row, request in enumerate(batch.requests):
            if request.finish is None or request.adapter is not None or request.kv_epoch != self.epoch:
                continue
            columns = batch.mask[row].nonzero().squeeze(1)
            tokens = request.context[:-1]  # the last sampled token has no KV yet
            if not tokens or len(tokens) != len(columns):
                continue
            # index_select copies: the entry does not hold the batch's tensors alive.
            keep = [(layer.keys[row : row + 1], layer.values[row : row + 1]) for layer in batch.cache.layers]
            self.insert(tokens, [(k.index_select(2, columns), v.index_select(2, columns)) for k, v in keep])

    def insert(self, tokens: list[int], layers: list[KV]) -> None:
        """Hold ``tokens`` with their KV; entries it extends go, and it is not kept when one extends it."""
        size = len(tokens)
        if not 0 < size <= self.max_tokens:
            return
        for key, entry in list(self._entries.items()):
            held = len(entry.tokens)
            if held <= size and tokens[:held] == entry.tokens:
                self._drop(key)
            elif held > size and entry.tokens[:size] == tokens:
                self._entries.move_to_end(key)
                return
        while self._entries and (self.tokens + size > self.max_tokens or len(self._entries) >= MAX_ENTRIES):
            self._drop(next(iter(self._entries)))
            self.evictions += 1
        self._entries[self._next] = _Entry(tokens, layers)
        self._next += 1
        self.tokens += size

    def _drop(self, key: int) -> None:
        self.tokens -= len(self._entries.pop(key).tokens)

    def _match(self, request: Request, context: list[int]) -> tuple[int, int | None]:
        if not self._entries or request.adapter is not None:
            return 0, None
        best, best_key = 0, None
        for key, entry in self._entries.items():
            length = common_prefix(entry.tokens, context)
            if length > best:
                best, best_key = length, key
        best = min(best, len(context) - 1)
        return (best, best_key) if best > 0 else (0, None)


MIN_SHARED = 32
"""Fewest prompt tokens two requests of one admission must share, beyond what is cached, for the later one to
wait a step and reuse the earlier one's KV (below it, a step's wait costs more than the prefill saved)."""


def defer_sharers(admitted: list[Request], cache: PrefixCache) -> tuple[list[Request], list[Request]]:
    """Split one admission into the requests to prefill now and those to hold back one step: a request whose
    context shares at least :data:`MIN_SHARED` uncached tokens with an earlier one's prefills after it and
    reuses its KV (:meth:`PrefixCache.store_prefilled`), as SGLang's scheduler does within a batch. The first
    request is never held back, so every step makes progress."""
    if not cache.max_tokens or len(admitted) < 2:
        return admitted, []
    now: list[Request] = []
    later: list[Request] = []
    for request in admitted:
        if request.adapter is None and now:
            cached = len(request.context) - cache.uncached(request)
            shared = max(common_prefix(request.context, r.context) for r in now if r.adapter is None)
            if shared - cached >= MIN_SHARED:
                later.append(request)
                continue
        now.append(request)
    return now, later


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of two token lists (slices compared in C, halving the range)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    low, high = 0, n  # a[:low] == b[:low] and a[:high] != b[:high]
    while high - low > 1:
        middle = (low + high) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle
    return low


def prefill_inputs(
    contexts: list[list[int]], hits: Sequence[Hit | None], pad: int, cache: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ids, attention mask and positions of one prefill of ``contexts``, with ``cache`` filled with their hits.

    Each row is its cached prefix (left-padded to the longest prefix) then its suffix (left-padded to
    the longest suffix): the mask covers both, so a row's padding may sit between its prefix and its
    suffix; positions count only real tokens. Without hits this is the plain left-padded prefill.
    """
    cached = [hit.length if hit is not None else 0 for hit in hits]
    past = max(cached, default=0)
    width = max(len(c) - n for c, n in zip(contexts, cached, strict=True))
    rows = len(contexts)
    ids = torch.full((rows, width), pad, dtype=torch.long)
    mask = torch.zeros((rows, past + width), dtype=torch.long)
    for row, (context, n) in enumerate(zip(contexts, cached, strict=True)):
        suffix = context[n:]
        ids[row, width - len(suffix) :] = torch.tensor(suffix)
        mask[row, past - n : past] = 1
        mask[row, past + width - len(suffix) :] = 1
    if past:
        some = next(hit for hit in hits if hit is not None)
        for index, layer in enumerate(cache.layers):
            keys, values = [], []
            for hit, n in zip(hits, cached, strict=True):
                k, v = hit.layers[index] if hit is not None else some.layers[index]
                keys.append(pad_left(k[:, :, :n], past))
                values.append(pad_left(v[:, :, :n], past))
            layer.update(torch.cat(keys), torch.cat(values))
    positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)[:, past:]
    return ids, mask, positions


def note_prefill(requests: list[Request], hits: Sequence[Hit | None], epoch: int, stats: EngineStats) -> None:
    """Count what a prefill computed and reused, and mark its requests' KV as the current epoch's."""
    for request, hit in zip(requests, hits, strict=True):
        reused = hit.length if hit is not None else 0
        stats.prefill_tokens += len(request.context) - reused
        stats.cached_tokens += reused
        request.kv_epoch = epoch
        if request.start_weight_version is None:  # its first prefill: what the prompt reused
            request.cached_tokens = reused
