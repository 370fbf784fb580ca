"""Retrying with exponential backoff: the one delay schedule and the one retry loop.

::

    from sandrl.retry import Backoff, retry

    backoff = Backoff(first_s=0.5, max_s=8.0, jitter=(0.8, 1.2))
    backoff.delay(1)    # before the first retry: 0.5 s (x 0.8..1.2); then 1, 2, 4, 8, 8, ... (x jitter)

    response = await retry(
        lambda attempt: client.get(url),               # attempt: 1, 2, ... (for a message, a header, a count)
        attempts=retries + 1,                          # all tries, the first included
        backoff=backoff,
        retry_on=(httpx.ConnectError, httpx.ReadError),  # exceptions worth another try (or a predicate)
        retry_if=lambda r: r.status_code in (502, 503, 504),  # results worth another try
        on_retry=lambda attempt, outcome: log(...),     # before each wait; may be async (a response to close)
    )

:func:`retry` calls ``attempt(1)``, then, while the outcome is retryable and tries are left,
``on_retry``, a wait of ``backoff.delay(n)`` and ``attempt(n + 1)``. The last try's exception
propagates unchanged and its result is returned even if ``retry_if`` holds, so the caller turns
either into its own typed error (with the count of tries: ``attempts``). An exception that
``retry_on`` does not name propagates at once; cancellation (``CancelledError``, a
``BaseException``) is never retried, and a wait is cancelled like any ``asyncio.sleep``.

A loop that does not fit (several kinds of failure sharing one count with different limits, a
server's ``Retry-After``, sync code) uses :meth:`Backoff.delay` alone for its waits.

Why not ``tenacity`` (installed as a dependency of a dependency) or ``stamina``: the loops here
pass the try's number into the try (an episode's ``attempt``, "N attempts" in a message), retry on
results as much as on exceptions (an episode that ended in a retryable error, an HTTP 503), close
a result before retrying it, and raise their own typed errors with the last exception as cause.
tenacity does each with a retry-state object, ``reraise=True`` and callbacks typed ``Any``;
stamina retries on exceptions only and always jitters. Fifty lines of ours keep the callers'
types and read in one place.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["Backoff", "retry"]

T = TypeVar("T")

_MAX_DOUBLINGS = 64
"""Beyond this many doublings every delay is at its cap (and 2.0**n would overflow a float near 1024)."""


@dataclass(frozen=True)
class Backoff:
    """Exponential delays: ``first_s`` before the first retry, doubled before each next one, at most
    ``max_s``, each multiplied by a factor drawn uniformly from ``jitter`` (``(1.0, 1.0)``: none)."""

    first_s: float
    max_s: float = math.inf
    jitter: tuple[float, float] = (1.0, 1.0)
    """The range of the factor; ``(0.5, 1.0)`` spreads clients that failed together over half the delay."""

    def __post_init__(self) -> None:
        low, high = self.jitter
        if not (self.first_s >= 0 and self.max_s >= 0 and 0 <= low <= high):
            raise ValueError(f"a backoff needs first_s >= 0, max_s >= 0 and 0 <= jitter low <= high, got {self}")

    def delay(self, retry: int) -> float:
        """The wait before retry number ``retry`` (1: the first retry, after the first try failed)."""
        if retry < 1:
            raise ValueError(f"retries are numbered from 1, got {retry}")
        base = min(self.first_s * 2.0 ** min(retry - 1, _MAX_DOUBLINGS), self.max_s)
        low, high = self.jitter
        return base if low == high == 1.0 else base * random.uniform(low, high)


async def retry(
    attempt: Callable[[int], Awaitable[T]],
    *,
    attempts: int,
    backoff: Backoff,
    retry_on: tuple[type[Exception], ...] | Callable[[Exception], bool] = (),
    retry_if: Callable[[T], bool] | None = None,
    on_retry: Callable[[int, T | Exception], object] | None = None,
) -> T:
    """``attempt(n)`` for n = 1, 2, ... up to ``attempts`` tries, waiting ``backoff.delay(n)`` after try n
    when it raised an exception ``retry_on`` names (or accepts) or returned a result ``retry_if`` accepts.

    ``on_retry(n, outcome)`` runs before each wait with what try n raised or returned (awaited if it
    returns an awaitable: a response to close). The last try's exception propagates; its result is returned.
    """
    if attempts < 1:
        raise ValueError(f"attempts counts the first try too: at least 1, got {attempts}")
    retryable = retry_on if callable(retry_on) else _instance_of(retry_on)
    for n in range(1, attempts + 1):
        outcome: T | Exception
        try:
            outcome = await attempt(n)
        except Exception as exc:
            if n == attempts or not retryable(exc):
                raise
            outcome = exc
        else:
            if n == attempts or retry_if is None or not retry_if(outcome):
                return outcome
        if on_retry is not None:
            done = on_retry(n, outcome)
            if inspect.isawaitable(done):
                await done
        await asyncio.sleep(backoff.delay(n))
    raise AssertionError("unreachable: the last try returns or raises")


def _instance_of(types: tuple[type[Exception], ...]) -> Callable[[Exception], bool]:
    return lambda exc: isinstance(exc, types)
