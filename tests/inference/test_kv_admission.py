"""Admission by the engines' KV capacity: a burst waits at the gate instead of making the engine retract;
engines that report nothing are not waited for; readings are bounded; the gate never blocks for good."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence

import pytest

from sandrl.errors import ConfigError, InferenceError
from sandrl.inference.base import InferenceClient, SamplingParams
from sandrl.inference.engine import Engine, EngineConfig
from sandrl.inference.fleet import affinity
from sandrl.inference.fleet.config import AdmissionConfig, FleetConfig
from sandrl.inference.kv_admission import AdmittedPolicy, KVAdmission, admission_stats, admitted
from sandrl.inference.kv_capacity import KVCapacity
from sandrl.inference.openai import OpenAIClient
from sandrl.inference.sglang import SGLangClient
from sandrl.inference.transport import HTTPConfig

from .fleet.standins import StandIn

TURN = SamplingParams(max_new_tokens=24, ignore_eos=True)
FAST = AdmissionConfig(interval_s=0.05)


async def episodes(policy: InferenceClient, n: int, turns: int = 3, *, full: bool = True) -> list[float]:
    """``n`` episodes at once, each ``turns`` calls on a growing history (``full``: each answer all of
    ``max_new_tokens``); each one's wait at the gate."""

    async def one(i: int) -> float:
        with affinity.bound(f"run/task#0/{i}") as route:
            ids = [(i * 13 + j) % 200 + 1 for j in range(40 + i)]
            for _ in range(turns):
                generation = await policy.generate(ids, TURN)
                assert len(generation.output_ids) == TURN.max_new_tokens or not full
                ids = [*ids, *generation.output_ids, 10, 11, 12]  # the observation
        return route.kv_wait_s

    return list(await asyncio.gather(*(one(i) for i in range(n))))


async def test_a_burst_waits_at_admission_instead_of_making_the_engine_retract() -> None:
    plain = Engine.load("tiny", EngineConfig(seed=0, kv_cache_tokens=600))
    gated_engine = Engine.load("tiny", EngineConfig(seed=0, kv_cache_tokens=600))
    try:
        unwaited = await episodes(plain, 12, turns=2)
        gated = admitted(gated_engine, FAST, where="the test engine")
        assert isinstance(gated, AdmittedPolicy)
        waited = await episodes(gated, 12, turns=2)
        # Same run: twelve 2-turn episodes whose calls (40-70 prompt + 24 new tokens) do not fit 600 at once.
        assert unwaited == [0.0] * 12 and plain.stats.kv_retractions > 0
        assert gated_engine.stats.kv_retractions == 0
        assert gated_engine.stats.prefill_tokens < plain.stats.prefill_tokens  # no prompt computed twice
        stats = admission_stats(gated)
        assert stats is not None and stats["reports"] is True and stats["calls"] == 24 and stats["timeouts"] == 0
        assert stats["waited"] > 0 and sum(waited) == pytest.approx(stats["wait_s"], abs=1e-3)
    finally:
        plain.close()
        gated_engine.close()


async def test_an_engine_that_reports_no_capacity_is_admitted_as_before() -> None:
    engine = StandIn(0).start()  # SGLang's /generate; every other route answers {"success": true}
    try:
        async with SGLangClient(engine.url, http=HTTPConfig(retries=0)) as client:
            policy = admitted(client, FAST, where=engine.url)
            first = await episodes(policy, 8, turns=2, full=False)
            await asyncio.sleep(FAST.interval_s * 2)
            later = await episodes(policy, 8, turns=2, full=False)
        stats = admission_stats(policy)
        assert stats is not None and stats["reports"] is False and stats["waited"] == 0 and stats["calls"] == 32
        assert max(first) < 5.0 and max(later) < 0.01  # the first calls waited for the one reading, then none
        # Asked once, both routes, then never again: no call per turn.
        assert [p for p in engine.paths() if p != "/generate"] == ["/v1/loads", "/metrics"]
        assert stats["readings"] == 1
    finally:
        engine.stop()
    async with OpenAIClient("http://127.0.0.1:9/v1", model="m") as openai:
        assert admitted(openai, FAST, where="an OpenAI server") is openai  # nothing to read: no gate at all


class Counted:
    """The engine's own reading, counted."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.times: list[float] = []

    async def kv_capacity(self) -> KVCapacity:
        self.times.append(time.monotonic())
        return await self.engine.kv_capacity()


async def test_readings_are_bounded_to_one_per_interval_whatever_the_episodes() -> None:
    engine = Engine.load("tiny", EngineConfig(seed=0, kv_cache_tokens=500))
    try:
        source = Counted(engine)
        gate = KVAdmission(source, AdmissionConfig(interval_s=0.1), where="the test engine")
        start = time.monotonic()
        await episodes(AdmittedPolicy(engine, gate), 24, turns=2)
        elapsed = time.monotonic() - start
        assert gate.waited > 0  # the readings were needed: calls waited for room
        assert len(source.times) <= elapsed / 0.1 + 1
        gaps = [b - a for a, b in zip(source.times, source.times[1:], strict=False)]
        assert min(gaps) >= 0.1 - 0.01
        assert engine.stats.kv_retractions == 0
    finally:
        engine.close()


class Scripted:
    """Readings in turn (the last repeats), or an error, or none that ever comes."""

    def __init__(self, readings: Sequence[KVCapacity | Exception | None]) -> None:
        self.readings = list(readings)
        self.asked = 0

    async def kv_capacity(self) -> KVCapacity | None:
        reading = self.readings[min(self.asked, len(self.readings) - 1)]
        self.asked += 1
        if isinstance(reading, Exception):
            raise reading
        if reading is None:
            await asyncio.sleep(3600)
        return reading


FULL = KVCapacity(running=4, queued=0, used_tokens=1000, total_tokens=1000)
ROOMY = KVCapacity(running=0, queued=0, used_tokens=0, total_tokens=1000)


async def test_a_call_waits_for_room_then_goes_and_never_beyond_max_wait() -> None:
    gate = KVAdmission(Scripted([FULL, FULL, ROOMY]), AdmissionConfig(interval_s=0.05))
    start = time.monotonic()
    first = await gate.admit(100)
    assert 0.09 <= first.waited_s == pytest.approx(time.monotonic() - start, abs=0.02)  # two readings of full
    gate.release(first)
    stuck = KVAdmission(Scripted([FULL]), AdmissionConfig(interval_s=0.05, max_wait_s=0.3))
    late = await stuck.admit(100)
    assert 0.29 <= late.waited_s < 1.0 and stuck.timeouts == 1  # someone else's load never left: it went anyway


async def test_queued_requests_past_the_threshold_hold_calls_back() -> None:
    queued = KVCapacity(running=8, queued=3, max_running=8)
    held = KVAdmission(Scripted([queued, queued, KVCapacity(running=2, queued=0, max_running=8)]), FAST)
    assert (await held.admit(10)).waited_s >= 0.09
    tolerant = KVAdmission(Scripted([queued]), AdmissionConfig(interval_s=0.05, max_queued=4))
    assert (await tolerant.admit(10)).waited_s < 0.02
    # A call that would itself queue counts: 7 running of 8, and two let through since the reading.
    almost = KVAdmission(Scripted([KVCapacity(running=6, queued=0, max_running=8)]), AdmissionConfig(interval_s=5))
    assert (await almost.admit(10)).waited_s < 0.02 and (await almost.admit(10)).waited_s < 0.02
    third = asyncio.ensure_future(almost.admit(10))
    await asyncio.sleep(0.1)
    assert not third.done()  # the batch is full by what the gate let through
    third.cancel()


async def test_readings_that_fail_or_hang_let_calls_through() -> None:
    failing = KVAdmission(Scripted([InferenceError("engine down")]), FAST)
    assert (await failing.admit(10)).waited_s < 0.05 and failing.failed_readings == 1 and failing.reports is None
    hanging = KVAdmission(Scripted([None]), FAST, read_timeout_s=0.2)
    calls = await asyncio.wait_for(asyncio.gather(*(hanging.admit(10) for _ in range(5))), timeout=2)
    assert all(c.waited_s < 0.5 for c in calls) and hanging.readings == 1  # one reading asked, shared


async def test_a_cancelled_waiter_leaves_the_line() -> None:
    gate = KVAdmission(Scripted([FULL, FULL, FULL, ROOMY]), FAST)
    first = asyncio.ensure_future(gate.admit(100))
    await asyncio.sleep(0.01)
    second = asyncio.ensure_future(gate.admit(100))
    await asyncio.sleep(0.01)
    first.cancel()
    assert (await asyncio.wait_for(second, timeout=2)).waited_s > 0
    assert not gate._queue


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("kv_admission_max_queued", -1, "kv_admission_max_queued must be a whole number >= 0"),
        ("kv_admission_interval_s", 0.0, "kv_admission_interval_s must be between 0.01 and 60"),
        ("kv_admission_interval_s", math.nan, "kv_admission_interval_s must be between"),
        ("kv_admission_max_wait_s", -3.0, "kv_admission_max_wait_s must be a positive number"),
        ("kv_admission", "yes", "kv_admission must be true or false"),
        ("kv_cache_tokens", -5, "kv_cache_tokens must be >= 0"),
    ],
)
def test_bad_settings_are_refused_by_name(field: str, value: object, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        FleetConfig(**{field: value})  # type: ignore[arg-type]
