"""Which image each task's sandboxes start from: fetched once per image, shared by every task and
episode that needs it.

The provider says (:meth:`~sandrl.sandbox.base.SandboxProvider.resolve_image` of the task's
:meth:`~sandrl.tasks.task.Task.image_source`): the local bubblewrap provider pulls a prebuilt image
into its store or builds the task's Dockerfile (a cache hit when unchanged), and says which it did
(:class:`~sandrl.sandbox.base.ImageFetcher`); the sandbox service's client, which builds nothing,
answers the task's prebuilt image or ``host``, and refuses a Dockerfile: build it on the sandbox
host and pass an ``image_for`` of your own to the runner there.

One fetch per image (:func:`image_key`: tasks that name one registry image share it), whoever asks
first: an episode, or the prefetch that fetches every task's image ahead of the episodes
(:mod:`sandrl.rollout.prefetch`); whoever asks later waits for that fetch, never starts a second.
With ``jobs``, at most that many fetches that episodes asked for run at once, in the order they
were asked (a runner's ``concurrency``: an image queued behind them could not have had its
episode run sooner). The prefetch fetches with what they leave (:meth:`TaskImages.room`) and is
never in their way: an episode never queues behind work done ahead.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from sandrl.sandbox.base import FetchedImage, ImageFetcher, ImageSource, SandboxProvider
from sandrl.tasks.task import Task

ImageFor = Callable[[Task], Awaitable[str]]
"""The image name of a task's sandboxes (raises for a task whose environment cannot be built)."""


def image_key(source: ImageSource) -> ImageSource:
    """What decides the image ``source`` gives: without a Dockerfile, only its prebuilt image (the
    tasks naming one registry image share one fetch); with one, everything but the label (the
    build is named after its task, and the builder's step cache shares what is common)."""
    if source.dockerfile_text is None:
        return ImageSource(label="", image=source.image)
    return dataclasses.replace(source, label="")


@dataclass(eq=False)
class ImageFetch:
    """One image's fetch: when it was asked for, started and ended, who asked first, how it went."""

    key: ImageSource
    source: ImageSource
    """The first asker's source (its label names that task in errors)."""
    ahead: bool
    """Started by the prefetch rather than by an episode."""
    asked_s: float
    started_s: float | None = None
    """When it left the queue of ``jobs`` (None: not yet)."""
    queued: bool = False
    """It waited for one of the ``jobs`` fetches before it to end."""
    ended_s: float | None = None
    task: asyncio.Task[FetchedImage] | None = None
    waiters: int = field(default=0, repr=False)
    abandoned: bool = field(default=False, repr=False)

    @property
    def seconds(self) -> float | None:
        """How long the fetch itself ran (its queueing apart)."""
        if self.started_s is None or self.ended_s is None:
            return None
        return self.ended_s - self.started_s


class TaskImages:
    """The runner's ``image_for``: each image fetched once, concurrent askers wait for that fetch.

    ``jobs``: at most this many fetches asked for by episodes at once (None: no bound), first asked
    first started. ``on_bytes`` hears every chunk a pull downloads (a progress bar's bytes).
    """

    def __init__(
        self,
        provider: SandboxProvider,
        *,
        jobs: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.provider = provider
        self.jobs = jobs
        self.clock = clock
        self.on_bytes: Callable[[int], None] | None = None
        self._fetches: dict[ImageSource, ImageFetch] = {}
        self._lanes = asyncio.Semaphore(jobs) if jobs is not None else None
        self._changed = asyncio.Event()

    async def __call__(self, task: Task) -> str:
        return (await self.fetch(task.image_source())).name

    def known(self, source: ImageSource) -> ImageFetch | None:
        """The fetch of ``source``'s image, running, queued or done (a cancelled one is forgotten)."""
        return self._fetches.get(image_key(source))

    def busy(self) -> int:
        """Fetches under way (or about to be), not counting those queued for one of the ``jobs``."""
        return sum(
            1
            for f in self._fetches.values()
            if f.task is not None and not f.task.done() and not (f.queued and f.started_s is None)
        )

    async def room(self, limit: int) -> None:
        """Wait until fewer than ``limit`` fetches are :meth:`busy`: the prefetch fetches ahead only
        with what the episodes' fetches leave (the images wanted now come first)."""
        while self.busy() >= limit:
            await self._changed.wait()

    def _poke(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def fetch(self, source: ImageSource, *, ahead: bool = False) -> FetchedImage:
        """``source``'s image on the provider: joins the fetch of that image if there is one, else
        starts it (``ahead``: for the prefetch, outside the episodes' ``jobs``). A fetch that failed
        stays failed for this run: its tasks' episodes fail alike, without asking again."""
        key = image_key(source)
        fetch = self._fetches.get(key)
        if fetch is None or fetch.abandoned:
            fetch = ImageFetch(key, source, ahead, self.clock())
            fetch.task = asyncio.ensure_future(self._run(fetch))
            fetch.task.add_done_callback(_retrieved)
            self._fetches[key] = fetch
        assert fetch.task is not None
        fetch.waiters += 1
        try:
            return await asyncio.shield(fetch.task)
        except asyncio.CancelledError:
            if fetch.waiters == 1 and not fetch.task.done():
                # The last one waiting for this image went away: stop its fetch and let it clean up
                # (whoever asks meanwhile starts afresh rather than join a fetch being stopped).
                fetch.abandoned = True
                fetch.task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await fetch.task
            if fetch.task.cancelled() and self._fetches.get(key) is fetch:
                del self._fetches[key]
            raise
        finally:
            fetch.waiters -= 1

    async def _run(self, fetch: ImageFetch) -> FetchedImage:
        lanes = None if fetch.ahead else self._lanes
        fetch.queued = lanes is not None and lanes.locked()
        try:
            async with lanes if lanes is not None else contextlib.nullcontext():
                fetch.started_s = self.clock()
                try:
                    return await self._fetch_one(fetch.source)
                finally:
                    fetch.ended_s = self.clock()
        finally:
            self._poke()

    async def _fetch_one(self, source: ImageSource) -> FetchedImage:
        if isinstance(self.provider, ImageFetcher):
            return await self.provider.fetch_image(source, on_bytes=self._heard)
        return FetchedImage(await self.provider.resolve_image(source), "named")

    def _heard(self, n: int) -> None:
        if self.on_bytes is not None:
            self.on_bytes(n)


def _retrieved(task: asyncio.Task[FetchedImage]) -> None:
    """Marks a fetch's failure as seen: the askers that hear it may all have been cancelled."""
    if not task.cancelled():
        task.exception()
