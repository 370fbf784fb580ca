"""A progress bar of episodes, with the running status counts; a no-op when disabled.

A :class:`sandrl.progress.Progress`: rich's bar on a terminal, a plain line every few seconds
(episodes done, rate, ETA, counts) in a log.
"""

from __future__ import annotations

from collections import Counter
from types import TracebackType

from rich.console import Console

from sandrl.host_memory import process_memory_bytes
from sandrl.progress import Progress
from sandrl.rollout.trajectory import Trajectory


class EpisodeProgress:
    """``with EpisodeProgress(total) as bar: bar.done(trajectory)``."""

    def __init__(self, total: int, *, enabled: bool = True, console: Console | None = None) -> None:
        self.counts: Counter[str] = Counter()
        self._progress: Progress | None = None
        if enabled:
            self._progress = Progress(console=console or Console(stderr=True))
            self._task = self._progress.add_task("episodes", total=total)

    def done(self, trajectory: Trajectory) -> None:
        self.counts[trajectory.status] += 1
        if trajectory.passed:
            self.counts["passed"] += 1
        if self._progress is not None:
            text = " ".join(f"{k}={v}" for k, v in sorted(self.counts.items()))
            memory = process_memory_bytes()
            if memory is not None:  # an eval that holds more and more shows it
                text += f" rss={memory[0] / 2**30:.1f}G peak={memory[1] / 2**30:.1f}G"
            self._progress.update(self._task, advance=1, detail=text)

    def __enter__(self) -> EpisodeProgress:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._progress is not None:
            self._progress.stop()
