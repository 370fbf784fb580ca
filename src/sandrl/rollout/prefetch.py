"""Every task's image in the provider's store before the episodes need it.

``sandrl images prefetch TASKS`` and ``sandrl tasks pull --images`` run :func:`prefetch_images`
with a progress bar and print its :class:`PrefetchReport`; ``sandrl eval`` (and ``sandrl train``)
start it in the background with :func:`images_ahead`, whose :class:`~sandrl.rollout.images.TaskImages`
is the runner's ``image_for``: an episode whose image is being fetched ahead waits for that fetch,
one whose image the prefetch has not reached yet starts it at once (the prefetch then finds it
running), so an episode waits only for its own image, never for another task's.

Each distinct image (:func:`~sandrl.rollout.images.image_key`) is fetched once, in the order of the
tasks, at most ``jobs`` at a time, and ahead only while fewer than ``jobs`` fetches run in all: the
images episodes want now are not slowed by those wanted later. A failure is the row of that image,
with its reason, and the rest go on.

``max_store_bytes`` bounds what is fetched ahead: before a fetch starts, the store's disk use is
measured, and at the bound the images not in the store are skipped (said so in the report);
fetches already running finish, so the store may pass the bound by what they bring. Nothing is
deleted: an episode whose image was skipped fetches it when it starts, as without a prefetch.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import warnings
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rich import filesize
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from sandrl.fetch_limits import PREFETCH_JOBS
from sandrl.progress import Progress
from sandrl.rollout.images import TaskImages, image_key
from sandrl.sandbox.base import FetchedImage, ImageFetcher, ImageSource, SandboxProvider
from sandrl.tasks.task import Task

REASON_CHARS = 600
"""A failure's reason is cut to this (a build's log is in the build's own error)."""
LISTED_PROBLEMS = 20
"""Failed and skipped images the report names one by one (printed, and in its JSON) before saying how many more."""

Outcome = Literal["pulled", "cached", "built", "host", "named", "failed", "skipped"]


@dataclass(frozen=True)
class ImageRow:
    """One distinct image of the tasks, and what its prefetch came to."""

    image: str
    """What the tasks name: a registry reference, ``Dockerfile of <task>``, or ``host``."""
    tasks: tuple[str, ...]
    outcome: Outcome
    name: str | None = None
    """The image's name in the store (what a sandbox starts from)."""
    seconds: float = 0.0
    """How long its fetch ran."""
    downloaded_bytes: int = 0
    reason: str | None = None
    """Why it failed or was skipped."""
    ahead: bool = True
    """Fetched by the prefetch; False: an episode asked for it first, and the prefetch waited for that fetch."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "image": self.image,
            "tasks": len(self.tasks),
            "outcome": self.outcome,
            "name": self.name,
            "seconds": round(self.seconds, 3),
            "downloaded_bytes": self.downloaded_bytes,
            "reason": self.reason,
            "ahead": self.ahead,
        }


@dataclass(frozen=True)
class PrefetchReport:
    rows: tuple[ImageRow, ...]
    wall_s: float
    jobs: int
    store_bytes: int | None = None
    """The store's disk use when the prefetch ended (None: the provider has no store here)."""
    max_store_bytes: int | None = None
    note: str | None = None
    """What the prefetch could not do as a whole (a provider with no store here)."""

    def count(self, outcome: Outcome) -> int:
        return sum(r.outcome == outcome for r in self.rows)

    @property
    def problems(self) -> tuple[ImageRow, ...]:
        """The failed and skipped images."""
        return tuple(r for r in self.rows if r.outcome in ("failed", "skipped"))

    def counts(self) -> dict[str, int]:
        found = Counter(r.outcome for r in self.rows)
        return {k: found[k] for k in ("pulled", "cached", "built", "failed", "skipped")} | {
            k: found[k] for k in ("host", "named") if found[k]
        }

    def line(self) -> str:
        """One line: the images, how each kind came, the time and the store's disk use."""
        said = ", ".join(f"{k} {v}" for k, v in self.counts().items())
        store = "" if self.store_bytes is None else f"; store {filesize.decimal(self.store_bytes)}"
        if self.max_store_bytes is not None:
            store += f" (bound {filesize.decimal(self.max_store_bytes)})"
        return f"{len(self.rows)} images ({said}) in {self.wall_s:.1f} s{store}" + (
            f"; {self.note}" if self.note else ""
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "images": len(self.rows),
            **self.counts(),
            "downloaded_bytes": sum(r.downloaded_bytes for r in self.rows),
            "wall_s": round(self.wall_s, 3),
            "jobs": self.jobs,
            "store_bytes": self.store_bytes,
            "max_store_bytes": self.max_store_bytes,
            "note": self.note,
            "problems": [r.to_dict() | {"tasks": list(r.tasks[:5])} for r in self.problems[:LISTED_PROBLEMS]],
            "problems_not_listed": max(0, len(self.problems) - LISTED_PROBLEMS),
        }


def describe(source: ImageSource) -> str:
    """What a row calls an image: its reference, else the Dockerfile it is built from, else ``host``."""
    if source.image is not None:
        return source.image
    if source.dockerfile_text is not None:
        return f"Dockerfile of {source.name or source.label}"
    return "host"


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 3] + "..."


async def prefetch_images(
    images: TaskImages,
    tasks: Sequence[Task],
    *,
    jobs: int = PREFETCH_JOBS,
    max_store_bytes: int | None = None,
    progress: bool = False,
    console: Console | None = None,
) -> PrefetchReport:
    """Fetch the image of every task of ``tasks`` into ``images``' provider (see the module), in the
    tasks' order, ``jobs`` at a time; ``progress`` shows a bar. Failures are rows, not raised."""
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    start = time.monotonic()
    wanted: dict[ImageSource, tuple[ImageSource, list[str]]] = {}
    for task in tasks:
        source = task.image_source()
        wanted.setdefault(image_key(source), (source, []))[1].append(task.id)
    provider = images.provider
    if not isinstance(provider, ImageFetcher):
        rows = tuple(ImageRow(describe(s), tuple(ids), "named", ahead=False) for s, ids in wanted.values())
        note = f"{type(provider).__name__} keeps no image store here: its host fetches each image a sandbox needs"
        return PrefetchReport(rows, time.monotonic() - start, jobs, max_store_bytes=max_store_bytes, note=note)
    lanes = asyncio.Semaphore(jobs)
    found: dict[ImageSource, ImageRow] = {}
    bar = _Bar(len(wanted), enabled=progress, console=console)

    async def one(key: ImageSource, source: ImageSource, task_ids: tuple[str, ...]) -> None:
        label = describe(source)
        try:
            got: FetchedImage | None = None
            async with lanes:
                if images.known(source) is None:
                    skip = await _over_bound(provider, source, max_store_bytes)
                    if skip is not None and images.known(source) is None:
                        found[key] = ImageRow(label, task_ids, "skipped", reason=skip)
                        return
                    await images.room(jobs)
                    if images.known(source) is None:
                        got = await images.fetch(source, ahead=True)
            if got is None:  # an episode asked first: wait for its fetch outside the lanes
                got = await images.fetch(source, ahead=True)
        except Exception as exc:
            found[key] = ImageRow(label, task_ids, "failed", reason=_reason(exc), **_timing(images, source))
        else:
            found[key] = ImageRow(
                label, task_ids, got.how, got.name, downloaded_bytes=got.downloaded_bytes, **_timing(images, source)
            )
        finally:
            if key in found:
                bar.done(found[key])

    images.on_bytes = bar.bytes
    try:
        with bar:
            await asyncio.gather(*(one(key, source, tuple(ids)) for key, (source, ids) in wanted.items()))
    finally:
        images.on_bytes = None
    used = await asyncio.to_thread(provider.store_bytes)
    rows = tuple(found[key] for key in wanted)
    return PrefetchReport(rows, time.monotonic() - start, jobs, used, max_store_bytes)


async def _over_bound(provider: ImageFetcher, source: ImageSource, max_store_bytes: int | None) -> str | None:
    """Why ``source``'s image is not fetched ahead: the store is at its bound and lacks the image."""
    if max_store_bytes is None or provider.cached_image(source) is not None:
        return None
    used = await asyncio.to_thread(provider.store_bytes)
    if used < max_store_bytes:
        return None
    return (
        f"the store holds {filesize.decimal(used)}, at its bound of {filesize.decimal(max_store_bytes)}: "
        "not fetched ahead (an episode that needs it fetches it when it starts)"
    )


def _timing(images: TaskImages, source: ImageSource) -> dict[str, Any]:
    fetch = images.known(source)
    if fetch is None:
        return {}
    return {"seconds": fetch.seconds or 0.0, "ahead": fetch.ahead}


class _Bar:
    """One bar over the images, the outcomes so far and the bytes downloaded in its detail."""

    def __init__(self, total: int, *, enabled: bool, console: Console | None) -> None:
        self.counts: Counter[str] = Counter()
        self.downloaded = 0
        self._progress = Progress(console=console or Console(stderr=True)) if enabled else None
        if self._progress is not None:
            self._task = self._progress.add_task("images", total=total)

    def _show(self, advance: int = 0) -> None:
        if self._progress is not None:
            counts = " ".join(f"{k}={v}" for k, v in sorted(self.counts.items()))
            detail = f"{counts}  {filesize.decimal(self.downloaded)} downloaded".strip()
            self._progress.update(self._task, advance=advance, detail=detail)

    def bytes(self, n: int) -> None:
        self.downloaded += n
        self._show()

    def done(self, row: ImageRow) -> None:
        self.counts[row.outcome] += 1
        self._show(1)

    def __enter__(self) -> _Bar:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()


class Prefetch:
    """A prefetch running in the background (:func:`images_ahead`): ``images`` is the runner's ``image_for``."""

    def __init__(self, images: TaskImages, job: asyncio.Future[PrefetchReport]) -> None:
        self.images = images
        self.job = job

    def report(self) -> PrefetchReport | None:
        """What it did, once it has finished (None before, or when it was stopped)."""
        if not self.job.done() or self.job.cancelled() or self.job.exception() is not None:
            return None
        return self.job.result()


@contextlib.asynccontextmanager
async def images_ahead(
    provider: SandboxProvider,
    tasks: Sequence[Task],
    *,
    episode_jobs: int | None = None,
    jobs: int | None = None,
    max_store_bytes: int | None = None,
) -> AsyncIterator[Prefetch]:
    """Every task's image fetched in the background, in the order of ``tasks`` (the order episodes
    will want them), for as long as the context lasts: give the runner ``prefetch.images`` as its
    ``image_for``. ``episode_jobs``: at most this many fetches that episodes asked for at once (the
    runner's ``concurrency``; None: no bound); ``jobs`` (None: :data:`PREFETCH_JOBS`): fetches
    ahead, started only while fewer than that many fetches of any kind run. Leaving the context
    stops what is still being fetched ahead (no episode waits for it then)."""
    jobs = jobs if jobs is not None else PREFETCH_JOBS
    images = TaskImages(provider, jobs=episode_jobs)
    job = asyncio.ensure_future(prefetch_images(images, tasks, jobs=jobs, max_store_bytes=max_store_bytes))
    try:
        yield Prefetch(images, job)
    finally:
        if not job.done():
            job.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await job
        if not job.cancelled() and job.exception() is not None:
            warnings.warn(f"fetching the tasks' images ahead failed: {job.exception()!r}", stacklevel=2)


def print_report(report: PrefetchReport, console: Console) -> None:
    """The counts, the store's disk use, and each failed or skipped image with its reason."""
    table = Table("outcome", "images", "downloaded", title="images ahead of the episodes", title_justify="left")
    for outcome, n in report.counts().items():
        if n:
            got = sum(r.downloaded_bytes for r in report.rows if r.outcome == outcome)
            table.add_row(outcome, str(n), filesize.decimal(got) if got else "")
    console.print(table)
    failed = [r for r in report.rows if r.outcome == "failed"]
    for row in failed[:LISTED_PROBLEMS]:
        tasks = escape(_some(row.tasks))
        console.print(
            f"[bold]failed[/] {escape(row.image)} [dim](tasks {tasks})[/]: {escape(row.reason or '')}", highlight=False
        )
    if len(failed) > LISTED_PROBLEMS:
        console.print(f"... and {len(failed) - LISTED_PROBLEMS} more failed (the JSON line lists {LISTED_PROBLEMS})")
    skipped = [r for r in report.rows if r.outcome == "skipped"]
    if skipped:
        console.print(
            f"[bold]skipped[/] {len(skipped)} images ({escape(_some([r.image for r in skipped]))}): "
            f"{escape(skipped[0].reason or '')}",
            highlight=False,
        )
    console.print(escape(report.line()), highlight=False)


def _some(names: Sequence[str], shown: int = 3) -> str:
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")
