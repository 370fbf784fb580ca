"""The embedded engine's bound on its running requests' KV cache, in tokens (``EngineConfig.kv_cache_tokens``).

A running request's KV holds one entry per token of its context: its prompt and the output so far (the
batch's left padding is not counted, nor the prefix cache, which has its own bound). With a bound the
engine behaves as vLLM's scheduler does with preemption by recompute (SGLang's retraction):

- a waiting request is admitted only while its context, and the token its prefill samples, fit beside the
  running requests' (:meth:`KVBudget.admissible`): the outputs still to come are not reserved, so a burst
  fills the cache and decoding then runs out of room;
- before a decode step whose tokens would not fit, the newest running requests are retracted
  (:meth:`KVBudget.retract_overflow`): their KV is dropped and they wait first in the queue, to be prefilled
  again from their prompt and the tokens they already have. Nothing is lost but that prefill's compute,
  which is what admission by capacity (:mod:`sandrl.inference.kv_admission`) exists to save;
- a request's ``max_new_tokens`` is capped at the bound less its prompt and a prompt that fills the bound is
  refused (:meth:`KVBudget.room_for`), so one request alone always fits: the batch is never retracted whole
  and the head of the queue always fits an idle engine.

The engine reports its load against the bound (:meth:`KVBudget.reading`, SGLang's ``/v1/loads``). With no
bound (0) every method says "fits", as the engine behaved before it had one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sandrl.errors import ConfigError
from sandrl.inference.batch import Request, RunningBatch
from sandrl.inference.kv_capacity import KVCapacity

UNBOUNDED = 1 << 62


class KVBudget:
    """``max_tokens`` of running requests' KV (0: no bound); see the module docstring."""

    def __init__(self, max_tokens: int) -> None:
        if max_tokens < 0:
            raise ConfigError(f"kv_cache_tokens must be >= 0 (0: no bound), got {max_tokens}")
        self.max_tokens = max_tokens

    @property
    def bounded(self) -> bool:
        return self.max_tokens > 0

    @staticmethod
    def used(running: Iterable[Request]) -> int:
        """KV tokens ``running`` hold after their next decode step (each row's context, its last token fed)."""
        return sum(len(r.prompt) + len(r.output_ids) for r in running)

    def room_for(self, prompt_tokens: int) -> int:
        """The most new tokens a request with this prompt may have; a ConfigError if the prompt fills the cache."""
        if not self.bounded:
            return UNBOUNDED
        if prompt_tokens >= self.max_tokens:
            raise ConfigError(
                f"the prompt has {prompt_tokens} tokens and the engine's KV cache holds {self.max_tokens} "
                "(kv_cache_tokens): shorten the conversation, or serve with a larger --kv-cache-tokens"
            )
        return self.max_tokens - prompt_tokens

    def admissible(self, waiting: Iterable[Request], running: Sequence[Request], room: int) -> int:
        """How many of the first waiting requests (cancelled ones skipped, not counted) fit beside ``running``,
        at most ``room`` (the batch's free rows)."""
        if not self.bounded:
            return room
        free = self.max_tokens - self.used(running)
        fitting = 0
        for request in waiting:
            if fitting >= room:
                break
            if request.cancelled:
                continue
            need = len(request.context) + 1  # the prefill samples one token, which the next decode feeds
            if need > free:
                break
            free -= need
            fitting += 1
        return fitting

    def retract_overflow(self, batch: RunningBatch) -> list[Request]:
        """Take the newest rows out of ``batch`` until the next decode step fits (never the last row); return
        them, oldest first, each with one more retraction counted."""
        if not self.bounded or len(batch) < 2:
            return []
        keep = len(batch)
        used = self.used(batch.requests)
        while keep > 1 and used > self.max_tokens:
            keep -= 1
            row = batch.requests[keep]
            used -= len(row.prompt) + len(row.output_ids)
        if keep == len(batch):
            return []
        retracted = batch.requests[keep:]
        batch.select(list(range(keep)))
        for request in retracted:
            request.retractions += 1
        return retracted

    def reading(self, running: Sequence[Request], queued: int, max_running: int) -> KVCapacity:
        """The engine's load now, as it reports it (``/v1/loads``)."""
        return KVCapacity(
            running=len(running),
            queued=queued,
            used_tokens=self.used(running),
            total_tokens=self.max_tokens or None,
            max_running=max_running,
        )
