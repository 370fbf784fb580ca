"""Progress of long work, for a person at a terminal and for a log file alike.

:class:`Progress` is rich's progress display, and every bar of sandrl (episodes of an eval or a
training step, task validation, the warm start, the benchmarks) is one. On an interactive
terminal it draws rich's bars in place. Anywhere else (stderr piped to a file, a Slurm or CI log)
rich would print nothing until the end, so instead it prints a plain line per bar every
``every_s`` seconds (``$SANDRL_PROGRESS_EVERY_S``, default 30)::

    episodes: 12/40  0.85/s  ETA 33s  completed=12 passed=7
    step 5/36 training: 16 samples, 3100 tokens  45s

Work shorter than ``every_s`` prints no line at all. The lines come from a thread, so work that
blocks (a training step, a model load) still shows it is alive.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import rich.progress
from rich import filesize
from rich.progress import BarColumn, MofNCompleteColumn, ProgressColumn, TextColumn, TimeElapsedColumn

EVERY_ENV = "SANDRL_PROGRESS_EVERY_S"
"""Seconds between two plain progress lines when stderr is not a terminal."""
DEFAULT_EVERY_S = 30.0


def every_s() -> float:
    """``$SANDRL_PROGRESS_EVERY_S`` (a positive number of seconds), else :data:`DEFAULT_EVERY_S`."""
    given = os.environ.get(EVERY_ENV, "").strip()
    try:
        value = float(given) if given else DEFAULT_EVERY_S
    except ValueError:
        value = DEFAULT_EVERY_S
    return value if value > 0 else DEFAULT_EVERY_S


def duration(seconds: float) -> str:
    """``45s``, ``3m05s``, ``2h07m``: short enough for a progress line."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def plain_line(task: rich.progress.Task) -> str:
    """One bar as a line of text: what, how far, how fast, how long still (``detail``: what else to say).

    With a total: ``what: done/total  rate/s  ETA t``; without: ``what: done  elapsed`` (just the
    elapsed time while nothing is counted, e.g. a phase of a training step). A task added with
    ``unit="bytes"`` counts in kB, MB, GB.
    """
    elapsed = task.elapsed or 0.0
    done = task.completed
    in_bytes = task.fields.get("unit") == "bytes"

    def amount(n: float) -> str:
        return filesize.decimal(int(n)) if in_bytes else f"{n:g}"

    parts = [str(task.description)]
    if task.total is not None:
        rate = done / elapsed if elapsed > 0 else 0.0
        parts[0] += f": {amount(done)}/{amount(task.total)}"
        parts.append(f"{amount(rate)}/s" if in_bytes else f"{rate:.2f}/s")
        if rate > 0 and done < task.total:
            parts.append(f"ETA {duration((task.total - done) / rate)}")
        elif done < task.total:
            parts.append(f"{duration(elapsed)} so far")
    else:
        if done:
            parts[0] += f": {amount(done)}"
        parts.append(duration(elapsed))
    detail = str(task.fields.get("detail", "")).strip()
    if detail:
        parts.append(detail)
    return "  ".join(parts)


def default_columns() -> tuple[ProgressColumn, ...]:
    """What, a bar, done/total, elapsed, and the ``detail`` field; text as written, never markup."""
    return (
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[detail]}", markup=False),
    )


class Progress(rich.progress.Progress):
    """rich's :class:`~rich.progress.Progress`, which also reports where no one sees a bar: see the module docstring.

    Used as rich's (``add_task``, ``advance``, ``update``, ``remove_task``); every task has a
    ``detail`` field (default empty), shown after the numbers.
    """

    def __init__(
        self, *columns: str | ProgressColumn, every: float | None = None, transient: bool = True, **kwargs: Any
    ) -> None:
        super().__init__(*(columns or default_columns()), transient=transient, **kwargs)
        self.every_s = every if every is not None else every_s()
        self._ticking: threading.Thread | None = None
        self._stop_ticking = threading.Event()

    @property
    def draws(self) -> bool:
        """Whether rich draws the bars (an interactive terminal, or Jupyter) rather than lines being printed."""
        return self.console.is_interactive or self.console.is_jupyter

    def add_task(self, description: str, *args: Any, **fields: Any) -> rich.progress.TaskID:
        fields.setdefault("detail", "")
        return super().add_task(description, *args, **fields)

    def start(self) -> None:
        if self.disable:
            return
        if self.draws:
            super().start()
            return
        # Not rich's Live: on a file it draws nothing until the end (and then a blank line).
        if self._ticking is None:
            self._stop_ticking.clear()
            self._ticking = threading.Thread(target=self._tick, name="sandrl-progress", daemon=True)
            self._ticking.start()

    def stop(self) -> None:
        if self.disable:
            return
        if self._ticking is not None:
            self._stop_ticking.set()
            self._ticking.join()
            self._ticking = None
            return
        super().stop()

    def lines(self) -> list[str]:
        """A plain line per visible task, as :func:`plain_line` writes it."""
        with self._lock:
            tasks = [t for t in self.tasks if t.visible and not t.finished]
            return [plain_line(t) for t in tasks]

    def _tick(self) -> None:
        while not self._stop_ticking.wait(self.every_s):
            with self._lock:  # printed before the tasks change: a line is never older than the one printed after it
                for line in self.lines():
                    self.console.print(line, markup=False, highlight=False, soft_wrap=True)
