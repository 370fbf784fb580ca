"""sandrl.retry: the delay schedule, which failures are tried again, and cancellation during a wait."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from sandrl.retry import Backoff, retry


def test_delays_double_from_the_first_up_to_the_cap() -> None:
    backoff = Backoff(first_s=0.5, max_s=8.0)
    assert [backoff.delay(n) for n in range(1, 8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert [Backoff(first_s=1.0).delay(n) for n in (1, 2, 3, 11)] == [1.0, 2.0, 4.0, 1024.0]  # no cap
    assert Backoff(first_s=3.0, max_s=2.0).delay(1) == 2.0  # the cap holds from the first wait
    assert Backoff(first_s=0.5, max_s=8.0).delay(5000) == 8.0  # no float overflow after many retries
    assert Backoff(first_s=0.0).delay(3) == 0.0


def test_jitter_multiplies_the_capped_delay_within_its_range() -> None:
    random.seed(7)
    backoff = Backoff(first_s=1.0, max_s=4.0, jitter=(0.5, 1.0))
    for n, base in ((1, 1.0), (2, 2.0), (3, 4.0), (9, 4.0)):
        seen = [backoff.delay(n) for _ in range(200)]
        assert all(0.5 * base <= d <= base for d in seen)
        assert max(seen) - min(seen) > 0.3 * base  # it does spread


def test_bad_schedules_are_refused() -> None:
    for bad in (
        {"first_s": -1.0},
        {"first_s": 1.0, "max_s": -1.0},
        {"first_s": 1.0, "jitter": (1.2, 0.8)},
        {"first_s": 1.0, "jitter": (-0.1, 1.0)},
    ):
        with pytest.raises(ValueError, match="a backoff needs"):
            Backoff(**bad)
    with pytest.raises(ValueError, match="numbered from 1"):
        Backoff(first_s=1.0).delay(0)


async def test_named_exceptions_are_retried_and_the_last_one_propagates() -> None:
    tries: list[int] = []

    async def flaky(n: int) -> str:
        tries.append(n)
        raise ConnectionError(f"try {n}")

    start = time.monotonic()
    with pytest.raises(ConnectionError, match="try 3"):
        await retry(flaky, attempts=3, backoff=Backoff(first_s=0.02), retry_on=(ConnectionError,))
    assert tries == [1, 2, 3]
    assert time.monotonic() - start >= 0.02 + 0.04  # waited before each retry, doubling


async def test_other_exceptions_propagate_at_once() -> None:
    tries: list[int] = []

    async def broken(n: int) -> str:
        tries.append(n)
        raise KeyError("not retryable")

    with pytest.raises(KeyError):
        await retry(broken, attempts=5, backoff=Backoff(first_s=0.0), retry_on=(ConnectionError,))
    assert tries == [1]


async def test_a_predicate_chooses_the_exceptions() -> None:
    async def once_then_fine(n: int) -> int:
        if n == 1:
            raise OSError("transient")
        return n

    assert await retry(once_then_fine, attempts=3, backoff=Backoff(0.0), retry_on=lambda e: "transient" in str(e)) == 2
    with pytest.raises(OSError):
        await retry(once_then_fine, attempts=3, backoff=Backoff(0.0), retry_on=lambda e: False)


async def test_results_retry_and_the_last_result_is_returned_even_if_retryable() -> None:
    async def status(n: int) -> int:
        return 503 if n < 3 else 200

    assert await retry(status, attempts=5, backoff=Backoff(0.0), retry_if=lambda s: s == 503) == 200
    assert await retry(status, attempts=2, backoff=Backoff(0.0), retry_if=lambda s: s == 503) == 503
    assert await retry(status, attempts=5, backoff=Backoff(0.0)) == 503  # no retry_if: any result is final


async def test_on_retry_sees_each_discarded_outcome_and_may_be_async() -> None:
    seen: list[tuple[int, object]] = []
    closed: list[int] = []

    async def close(n: int, outcome: object) -> None:
        seen.append((n, outcome))
        closed.append(n)

    async def attempt(n: int) -> str:
        if n == 1:
            raise ConnectionError("down")
        return "busy" if n == 2 else "ok"

    result = await retry(
        attempt,
        attempts=4,
        backoff=Backoff(0.0),
        retry_on=(ConnectionError,),
        retry_if=lambda r: r == "busy",
        on_retry=close,
    )
    assert result == "ok" and closed == [1, 2]
    assert isinstance(seen[0][1], ConnectionError) and seen[1] == (2, "busy")

    sync_seen: list[int] = []
    await retry(
        attempt,
        attempts=3,
        backoff=Backoff(0.0),
        retry_on=(ConnectionError,),
        on_retry=lambda n, _: sync_seen.append(n),
    )
    assert sync_seen == [1]


async def test_cancelling_during_a_wait_stops_the_retries() -> None:
    tries: list[int] = []

    async def down(n: int) -> None:
        tries.append(n)
        raise ConnectionError("down")

    task = asyncio.ensure_future(retry(down, attempts=5, backoff=Backoff(first_s=30.0), retry_on=(ConnectionError,)))
    await asyncio.sleep(0.05)  # the first try failed; the loop waits 30 s
    start = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.monotonic() - start < 1.0 and tries == [1]


async def test_cancellation_inside_a_try_is_never_retried() -> None:
    tries: list[int] = []

    async def cancelled(n: int) -> None:
        tries.append(n)
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await retry(cancelled, attempts=5, backoff=Backoff(0.0), retry_on=lambda e: True)
    assert tries == [1]


async def test_attempts_counts_the_first_try() -> None:
    async def never(n: int) -> None:
        raise AssertionError("not called")

    with pytest.raises(ValueError, match="at least 1"):
        await retry(never, attempts=0, backoff=Backoff(0.0))
