"""asyncio helpers the rest of sandrl shares.

``asyncio.gather`` resolves as soon as one of its awaitables fails or is cancelled, while the
others may still be running: cancel a run of episodes and ``gather`` returns while half of them
are still closing their sandboxes. :func:`gather_all` returns or raises only once every awaitable
has finished, so "the run was cancelled" also means "nothing of it is left running";
:func:`wait_out` is the wait underneath, for cleanup that must finish even when cancelled.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Collection
from typing import Any, TypeVar

T = TypeVar("T")


async def gather_all(*aws: Awaitable[T]) -> list[T]:
    """The results of ``aws`` in order, like ``asyncio.gather``, but never leaving one running.

    If one fails or the caller is cancelled, the others are cancelled and awaited (through
    further cancellations too) before the first error, or the cancellation, propagates.
    """
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            # Once is enough: a second cancel would cut short the cleanup the first one started.
            already = isinstance(task, asyncio.Task) and task.cancelling() > 0
            if not task.done() and not already:
                task.cancel()
        await wait_out(tasks)
        raise


async def wait_out(futures: Collection[asyncio.Future[Any]], *, timeout_s: float | None = None) -> bool:
    """Wait until every one of ``futures`` is done, or ``timeout_s`` passed; True if all are done.

    A cancellation of the caller does not cut the wait short (cleanup, such as closing a
    sandbox, runs to its end): it is raised once the wait is over. The futures' exceptions
    are retrieved, so asyncio logs no "exception was never retrieved"; their owner reads them.
    """
    cancelled = False
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not all(f.done() for f in futures):
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            break
        try:
            await asyncio.wait(futures, timeout=remaining)
        except asyncio.CancelledError:
            cancelled = True
    for future in futures:
        if future.done() and not future.cancelled():
            future.exception()
    if cancelled:
        raise asyncio.CancelledError
    return all(f.done() for f in futures)
