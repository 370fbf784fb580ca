"""asyncio helpers the rest of sandrl shares.

``asyncio.gather`` resolves as soon as one of its awaitables fails or is cancelled, while the
others may still be running: cancel a run of episodes and ``gather`` returns while half of them
are still closing their sandboxes. :func:`gather_all` returns or raises only once every awaitable
has finished, so "the run was cancelled" also means "nothing of it is left running".
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
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
        await _wait_out(tasks)
        raise


async def _wait_out(tasks: Sequence[asyncio.Future[Any]]) -> None:
    cancelled = False
    while not all(t.done() for t in tasks):
        try:
            await asyncio.wait(tasks)
        except asyncio.CancelledError:
            cancelled = True
    for task in tasks:
        if not task.cancelled():
            task.exception()  # retrieved, so asyncio logs no "exception was never retrieved"
    if cancelled:
        raise asyncio.CancelledError
