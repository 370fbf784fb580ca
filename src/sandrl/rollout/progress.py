"""A progress bar of episodes (rich), with the running status counts; a no-op when disabled."""

from __future__ import annotations

from collections import Counter
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from sandrl.rollout.trajectory import Trajectory


class EpisodeProgress:
    """``with EpisodeProgress(total) as bar: bar.done(trajectory)``."""

    def __init__(self, total: int, *, enabled: bool = True, console: Console | None = None) -> None:
        self.counts: Counter[str] = Counter()
        self._progress: Progress | None = None
        if enabled:
            self._progress = Progress(
                TextColumn("episodes"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.description}"),
                console=console or Console(stderr=True),
                transient=True,
            )
            self._task = self._progress.add_task("", total=total)

    def done(self, trajectory: Trajectory) -> None:
        self.counts[trajectory.status] += 1
        if trajectory.passed:
            self.counts["passed"] += 1
        if self._progress is not None:
            text = " ".join(f"{k}={v}" for k, v in sorted(self.counts.items()))
            self._progress.update(self._task, advance=1, description=text)

    def __enter__(self) -> EpisodeProgress:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._progress is not None:
            self._progress.stop()
