"""Admission by the engines' KV capacity: a model call waits for room instead of making an engine retract.

An engine admits requests by what fits its KV cache *now*; the outputs still to come are not reserved,
so a burst of episodes fills the cache and decoding then runs out of room: the engine retracts running
requests (drops their KV, prefills them again later: SGLang's retraction, vLLM's preemption), and the
same tokens are computed twice, or more under pressure. :class:`KVAdmission` holds each call back at the
client until the engines have room for all of it, and :class:`AdmittedPolicy` puts it in front of a
policy: every ``generate`` of every episode (sandrl's agent, and harnesses through the session gateway)
passes it, so the gate works per model call, between an episode's turns, where an engine's memory is
actually taken (an episode that waits on its sandbox holds no running request).

A call needing ``need`` tokens (its prompt and ``max_new_tokens``) is let through, in arrival order,
when, by the latest reading of the engines (:class:`~sandrl.inference.kv_capacity.KVCapacity`) and the
calls let through since:

- no more than ``max_queued`` requests would wait in an engine's queue (its batch full), and
- ``need`` fits the free KV tokens the reading reports, less what the calls let through since the
  reading will take, *and* the KV pool less every call in flight's full ``need``: the run's own calls
  can then never outgrow the cache, so the engines never retract them (a call's ``need`` is capped at
  the pool, so one call alone always goes).

Readings are taken when one is due (at most one per ``interval_s``, shared by every call: never one per
turn) on the way in of a call that finds the last one stale, and while calls wait. The gate never
blocks for good: an engine that reports nothing (:class:`~sandrl.inference.kv_capacity.CapacityProbe`:
a plain OpenAI server, an older SGLang) turns it off, as calls went before; a reading that fails or takes
longer than :data:`READ_TIMEOUT_S` lets calls through until the next one; and a call waits at most
``max_wait_s``. Each call's wait is added to its episode's routing key
(:class:`~sandrl.inference.fleet.affinity.RouteKey`), which the runner records as ``Timings.kv_wait_s``.
Several engines behind one router are summed (the router answers ``/v1/loads`` for all): the gate bounds
the fleet, the router balances the episodes over it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol, cast, runtime_checkable

from sandrl.inference.base import Generation, InferenceClient, SamplingParams
from sandrl.inference.fleet import affinity
from sandrl.inference.fleet.config import AdmissionConfig
from sandrl.inference.kv_capacity import KVCapacity
from sandrl.inference.policy_wrapper import PolicyWrapper

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 5.0
"""Longest a call waits for a reading; past it the call goes as if none had been asked for."""


@runtime_checkable
class ReportsCapacity(Protocol):
    """A policy that can say its engines' load and KV room (the embedded engine, the SGLang and vLLM clients)."""

    async def kv_capacity(self) -> KVCapacity | None:
        """The engines' reading now; None: they report none."""


@dataclass(eq=False)
class Pass:
    """One call let through: what it reserved, when, and how long it waited."""

    need: int
    admitted_at: float
    waited_s: float


class KVAdmission:
    """The gate of one policy's calls; see the module docstring."""

    def __init__(
        self,
        source: ReportsCapacity,
        config: AdmissionConfig | None = None,
        *,
        where: str = "the inference engines",
        read_timeout_s: float = READ_TIMEOUT_S,
    ) -> None:
        self.source = source
        self.config = config or AdmissionConfig()
        self.where = where
        self.read_timeout_s = read_timeout_s
        self.reports: bool | None = None
        """Whether the engines report their capacity; None until the first reading."""
        self.reading: KVCapacity | None = None
        """The last reading; None: none, or the last one failed (calls go until the next)."""
        self._asked_at = -math.inf
        """When the last reading was asked for (one per ``interval_s``)."""
        self._seen_at = -math.inf
        """When :attr:`reading` was asked for: the calls let through since are not in it."""
        self._reading_task: asyncio.Task[KVCapacity | None] | None = None
        self._in_flight: set[Pass] = set()
        self._queue: deque[asyncio.Event] = deque()
        self._refusals = 0
        """Times the first in line found no room: a call in line while it grew waited for room."""
        self._failing = False
        self.calls = 0
        self.waited = 0
        """Calls that found no room and waited for it."""
        self.wait_s = 0.0
        """Seconds calls spent at the gate in all (waiting for a reading included)."""
        self.longest_wait_s = 0.0
        self.timeouts = 0
        self.readings = 0
        """Readings asked of the engines."""
        self.failed_readings = 0

    async def admit(self, need: int) -> Pass:
        """Wait until a call of ``need`` KV tokens fits (see the module docstring); :meth:`release` it after."""
        start = time.monotonic()
        self.calls += 1
        if self.reports is False:
            return self._let_through(need, start, held=False)
        turn = asyncio.Event()  # set when it is this call's turn to look (it is first in line, and something changed)
        self._queue.append(turn)
        refusals = self._refusals
        try:
            while True:
                timeout = math.inf
                if self._queue[0] is turn:
                    reading = await self._current()
                    if reading is None or self._fits(reading, need):
                        break
                    self._refusals += 1
                    timeout = max(self._asked_at + self.config.interval_s - time.monotonic(), 0.001)
                left = start + self.config.max_wait_s - time.monotonic()
                if left <= 0:
                    self.timeouts += 1
                    log.warning(
                        "a model call waited %.0f s for room on %s and goes anyway "
                        "([inference] kv_admission_max_wait_s)",
                        self.config.max_wait_s,
                        self.where,
                    )
                    break
                turn.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(turn.wait(), timeout=min(left, timeout))
        finally:
            self._queue.remove(turn)
            self._notify()  # the next in line looks
        return self._let_through(need, start, held=self._refusals > refusals)

    def release(self, admitted: Pass) -> None:
        """The call ended (answered, failed or cancelled): its reservation is free again."""
        self._in_flight.discard(admitted)
        self._notify()

    def stats(self) -> dict[str, Any]:
        return {
            "reports": self.reports,
            "calls": self.calls,
            "waited": self.waited,
            "wait_s": round(self.wait_s, 4),
            "longest_wait_s": round(self.longest_wait_s, 4),
            "timeouts": self.timeouts,
            "readings": self.readings,
            "failed_readings": self.failed_readings,
        }

    # -- the decision

    def _fits(self, reading: KVCapacity, need: int) -> bool:
        since = [p for p in self._in_flight if p.admitted_at >= self._seen_at]  # not in the reading yet
        queued = reading.queued
        if reading.max_running is not None:
            queued += max(0, reading.running + len(since) + 1 - reading.max_running)
        if queued > self.config.max_queued:
            return False
        total = reading.total_tokens
        if total is None:
            return True
        need = min(need, total)
        seen_free = total - (reading.used_tokens or 0) - sum(p.need for p in since)
        own_free = total - sum(p.need for p in self._in_flight)
        return need <= min(seen_free, own_free)

    def _let_through(self, need: int, start: float, *, held: bool) -> Pass:
        now = time.monotonic()
        waited = now - start
        admitted = Pass(need, now, waited)
        self._in_flight.add(admitted)
        self.waited += held
        self.wait_s += waited
        self.longest_wait_s = max(self.longest_wait_s, waited)
        return admitted

    def _notify(self) -> None:
        """Something changed (a reading, a call ended or left the line): the first in line looks again; the
        others wait for their turn (or their own ``max_wait_s``), so a change wakes one call, not all."""
        if self._queue:
            self._queue[0].set()

    # -- readings

    async def _current(self) -> KVCapacity | None:
        """The reading to decide by: the last one while it is fresh, else a new one (one at a time)."""
        if self.reports is False:
            return None
        if self._reading_task is None:
            if time.monotonic() - self._asked_at < self.config.interval_s:
                return self.reading
            asked_at = self._asked_at = time.monotonic()
            self.readings += 1
            # In a context of its own: the reading is no episode's call (no routing key goes with it).
            task = asyncio.get_running_loop().create_task(self.source.kv_capacity(), context=contextvars.Context())
            task.add_done_callback(lambda done: self._took_reading(done, asked_at))
            self._reading_task = task
        task = self._reading_task
        # Each call waits for a reading only until read_timeout_s after it was asked: one that hangs holds the
        # line once, not once per call. asyncio.wait neither raises nor cancels (the task is shared).
        left = self._asked_at + self.read_timeout_s - time.monotonic()
        if left > 0:
            await asyncio.wait({task}, timeout=left)
        if not task.done():
            task.cancel()  # a failed reading (counted as one); the next is asked for when due
            return None
        return self.reading

    def _took_reading(self, task: asyncio.Task[KVCapacity | None], asked_at: float) -> None:
        self._reading_task = None
        self._seen_at = asked_at
        error = None if task.cancelled() else task.exception()
        if task.cancelled() or error is not None:
            self.failed_readings += 1
            self.reading = None
            # Calls go without a reading until the next, asked no sooner than read_timeout_s from now: an engine
            # that hangs holds the line one read timeout in two at most.
            self._asked_at = time.monotonic() + max(0.0, self.read_timeout_s - self.config.interval_s)
            if not self._failing:
                self._failing = True
                log.warning(
                    "reading the load of %s failed (%s): calls go without waiting until one works",
                    self.where,
                    error or f"no answer within {self.read_timeout_s:g} s",
                )
        else:
            reading = task.result()
            self._failing = False
            if reading is None:
                log.warning(
                    "%s report no KV capacity (/v1/loads, vLLM's /metrics): model calls go without waiting "
                    "([inference] kv_admission)",
                    self.where,
                )
                self.reports = False
            else:
                self.reports = True
            self.reading = reading
        self._notify()


class AdmittedPolicy(PolicyWrapper):
    """``inner``, whose calls pass ``admission`` first (see the module docstring); everything else is ``inner``'s."""

    def __init__(self, inner: InferenceClient, admission: KVAdmission) -> None:
        super().__init__(inner)
        self.admission = admission

    async def generate(self, input_ids: list[int], params: SamplingParams) -> Generation:
        admitted = await self.admission.admit(len(input_ids) + params.max_new_tokens)
        route = affinity.current()
        if route is not None:
            route.kv_wait_s += admitted.waited_s
        try:
            return await self.inner.generate(input_ids, params)
        finally:
            self.admission.release(admitted)

    def admission_stats(self) -> dict[str, Any]:
        """How the calls fared at the gate (the runner's summary: ``kv_admission``)."""
        return self.admission.stats()


def admission_stats(policy: InferenceClient | None) -> dict[str, Any] | None:
    """How ``policy``'s calls fared at its gate (:meth:`KVAdmission.stats`); None: it has none. Looked up by
    name, not by type: a policy that wraps an :class:`AdmittedPolicy` (weights by broadcast) passes it on."""
    stats = getattr(policy, "admission_stats", None)
    return cast(dict[str, Any], stats()) if callable(stats) else None


def admitted(policy: InferenceClient, config: AdmissionConfig, *, where: str) -> InferenceClient:
    """``policy`` behind a :class:`KVAdmission` of ``config``; ``policy`` itself when it cannot report its
    engines' capacity (an OpenAI-compatible client: said once, and calls go as before)."""
    if not isinstance(policy, ReportsCapacity):
        log.warning("%s cannot report its engines' KV capacity: [inference] kv_admission has no effect", where)
        return policy
    return AdmittedPolicy(policy, KVAdmission(policy, config, where=where))
