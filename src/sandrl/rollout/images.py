"""Which image each task's sandboxes start from: resolved once per task, shared by all its episodes.

The provider says (:meth:`~sandrl.sandbox.base.SandboxProvider.resolve_image` of the task's
:meth:`~sandrl.tasks.task.Task.image_source`): the local bubblewrap provider builds the task's
Dockerfile (a cache hit when unchanged); the sandbox service's client, which builds nothing,
answers the task's prebuilt image or ``host``, and refuses a Dockerfile: build it on the sandbox
host and pass an ``image_for`` of your own to the runner there.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Awaitable, Callable

from sandrl.sandbox.base import SandboxProvider
from sandrl.tasks.task import Task

ImageFor = Callable[[Task], Awaitable[str]]
"""The image name of a task's sandboxes (raises for a task whose environment cannot be built)."""


class TaskImages:
    """Resolves and caches the image of each task; concurrent calls for one task build once."""

    def __init__(self, provider: SandboxProvider) -> None:
        self.provider = provider
        self._images: dict[str, asyncio.Future[str]] = {}
        self._waiters: Counter[str] = Counter()

    async def __call__(self, task: Task) -> str:
        key = task.key
        future = self._images.get(key)
        if future is None or future.cancelled():
            future = asyncio.ensure_future(self._resolve(task))
            self._images[key] = future
        self._waiters[key] += 1
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            if self._waiters[key] == 1 and not future.done():
                # The last one waiting for this build went away: stop it and let it clean up.
                future.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await future
                self._images.pop(key, None)
            raise
        finally:
            self._waiters[key] -= 1

    async def _resolve(self, task: Task) -> str:
        return await self.provider.resolve_image(task.image_source())
