"""Every tracker a run names, behind one object: a tracker that fails is reported once and dropped.

A tracker is an edge the run does not control (a library, a server, credentials): whatever it
raises, while opening, logging or closing, costs one line on the console, naming the tracker, what
failed and what to do, and the run goes on with the others. ``metrics.jsonl`` is written before
any tracker sees a step, so nothing of a step is lost with a tracker.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from sandrl.inference.tokenizer import Tokenizer
from sandrl.rollout.trajectory import Trajectory
from sandrl.train.trackers.base import Tracker, scalars
from sandrl.train.trackers.episodes import sample_episodes
from sandrl.train.trackers.names import JSONL, check_trackers
from sandrl.wiring.eval_report import shown_text

OPENERS: dict[str, str] = {
    "tensorboard": "sandrl.train.trackers.tensorboard_tracker",
    "wandb": "sandrl.train.trackers.wandb_tracker",
    "mlflow": "sandrl.train.trackers.mlflow_tracker",
}
"""The module of each tracker; each has ``open_tracker(output_dir, run_name) -> Tracker`` and ``ADVICE``."""


class Trackers:
    """The run's open trackers; each call goes to each, and one that raises is reported and dropped."""

    def __init__(self, trackers: Sequence[Tracker], console: Console) -> None:
        self.open: list[Tracker] = list(trackers)
        self.console = console
        self.failed: dict[str, str] = {}
        """Trackers dropped, and what failed (the line printed)."""

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.open]

    def log_config(self, config: Mapping[str, Any]) -> None:
        for tracker in list(self.open):
            self._guard(tracker, "logging the config", lambda t: t.log_config(config))

    def log_step(
        self, record: Mapping[str, Any], trajectories: Sequence[Trajectory] = (), tokenizer: Tokenizer | None = None
    ) -> None:
        """One step's line of ``metrics.jsonl`` (made flat numbers) and a few of its episodes, to each tracker."""
        if not self.open:
            return
        step = int(record["step"])
        metrics = scalars(record)
        episodes = sample_episodes(step, trajectories, tokenizer)
        for tracker in list(self.open):
            self._guard(tracker, f"logging step {step}", lambda t: t.log_step(step, metrics, episodes))

    def close(self, finished: bool = True) -> None:
        """Close each (once; a second call does nothing)."""
        trackers, self.open = self.open, []
        for tracker in trackers:
            self._guard(tracker, "closing", lambda t: t.close(finished))

    def _guard(self, tracker: Tracker, doing: str, call: Callable[[Tracker], None]) -> None:
        try:
            call(tracker)
        except Exception as exc:  # any failure of a tracker is the tracker's; the run goes on
            if tracker in self.open:
                self.open.remove(tracker)
            self.report(tracker.name, doing, exc)

    def report(self, name: str, doing: str, exc: BaseException) -> None:
        advice = getattr(importlib.import_module(OPENERS[name]), "ADVICE", "") if name in OPENERS else ""
        line = (
            f"warning: tracker {name} failed {doing} ({type(exc).__name__}: {shown_text(str(exc))}); "
            f"the run goes on without it (metrics.jsonl has every step){'; ' + advice if advice else ''}"
        )
        self.failed[name] = line
        self.console.print(line, highlight=False, markup=False, soft_wrap=True)


def open_trackers(trackers: Sequence[str], output_dir: Path, console: Console) -> Trackers:
    """The trackers of ``[run] trackers`` (``jsonl``, written by the session itself, needs none) for the
    run in ``output_dir``, opened; one that fails to open is reported and left out. Prints where each writes."""
    names = [n for n in dict.fromkeys(trackers) if n != JSONL]
    check_trackers(names)
    out = Path(output_dir)
    opened = Trackers([], console)
    for name in names:
        try:
            opener = importlib.import_module(OPENERS[name]).open_tracker
            opened.open.append(opener(out, out.name))
        except Exception as exc:  # an import error, no credentials, a server down: reported, the run goes on
            opened.report(name, "opening", exc)
    where = "".join(f", {t.name} -> {t.location}" for t in opened.open)
    console.print(f"trackers: metrics.jsonl{where}", highlight=False, markup=False, soft_wrap=True)
    console.print(
        f"view: sandrl view {out}  (the run's page, while it runs and after)",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    return opened
