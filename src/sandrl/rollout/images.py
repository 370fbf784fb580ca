"""Which image each task's sandboxes start from: built once per task, shared by all its episodes.

On the local bubblewrap provider the image is built from the task's Dockerfile by
:func:`sandrl.tasks.build.ensure_task_image` (a cache hit when unchanged). Another provider
(the sandbox service) builds on its own host; pass an ``image_for`` of your own to the runner
there. A task without a Dockerfile runs in ``host``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Awaitable, Callable

from sandrl.errors import TaskError
from sandrl.sandbox.base import SandboxProvider
from sandrl.sandbox.bwrap import BwrapProvider
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
        key = f"{task.source}:{task.id}"
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
        if isinstance(self.provider, BwrapProvider):
            from sandrl.tasks.build import ensure_task_image

            return await ensure_task_image(task, self.provider)
        if task.environment.dockerfile_text is None:
            return task.environment.docker_image or "host"
        raise TaskError(
            f"task {task.id} has a Dockerfile, and this provider cannot build it here: build the image on the "
            "sandbox host (sandrl images build) and pass the runner an image_for that names it"
        )
