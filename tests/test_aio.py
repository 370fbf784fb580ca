"""gather_all: nothing it started is still running when it returns or raises."""

from __future__ import annotations

import asyncio

import pytest

from sandrl.aio import gather_all, wait_out


async def _slow_to_stop(finished: list[str], name: str, cleanup_s: float) -> str:
    try:
        await asyncio.sleep(60)
    finally:
        await asyncio.shield(asyncio.sleep(cleanup_s))  # like closing a sandbox
        finished.append(name)
    return name


async def test_results_in_order() -> None:
    async def value(v: int, delay: float) -> int:
        await asyncio.sleep(delay)
        return v

    assert await gather_all(value(1, 0.03), value(2, 0.0), value(3, 0.01)) == [1, 2, 3]


async def test_cancelling_the_caller_waits_for_every_cleanup() -> None:
    finished: list[str] = []
    run = asyncio.ensure_future(gather_all(_slow_to_stop(finished, "fast", 0.0), _slow_to_stop(finished, "slow", 0.2)))
    await asyncio.sleep(0.05)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    # asyncio.gather would have returned after "fast" alone.
    assert sorted(finished) == ["fast", "slow"]


async def test_a_second_cancel_does_not_cut_the_wait_short() -> None:
    finished: list[str] = []
    run = asyncio.ensure_future(gather_all(_slow_to_stop(finished, "a", 0.0), _slow_to_stop(finished, "b", 0.2)))
    await asyncio.sleep(0.05)
    run.cancel()
    await asyncio.sleep(0.05)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert sorted(finished) == ["a", "b"]


async def test_a_failure_cancels_and_awaits_the_rest_then_raises() -> None:
    finished: list[str] = []

    async def boom() -> str:
        await asyncio.sleep(0.02)
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        await gather_all(boom(), _slow_to_stop(finished, "other", 0.1))
    assert finished == ["other"]


async def test_wait_out_times_out_and_outlasts_a_cancellation() -> None:
    slow = asyncio.ensure_future(asyncio.sleep(10))
    assert await wait_out([slow], timeout_s=0.02) is False
    slow.cancel()

    closing = asyncio.ensure_future(asyncio.sleep(0.05, "closed"))
    waiter = asyncio.ensure_future(wait_out([closing]))
    await asyncio.sleep(0.01)
    waiter.cancel()  # the caller is cancelled: the wait goes on, then the cancellation is raised
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert closing.done() and closing.result() == "closed"

    async def fails() -> None:
        raise RuntimeError("boom")

    failed = asyncio.ensure_future(fails())
    assert await wait_out([failed]) is True  # its error is retrieved, left for the owner to read
    assert isinstance(failed.exception(), RuntimeError)
