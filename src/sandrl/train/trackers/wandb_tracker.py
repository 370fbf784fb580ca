"""Weights & Biases, offline unless the environment says otherwise.

``WANDB_MODE`` unset, the run is logged offline under ``<output_dir>/wandb`` (``wandb sync`` uploads
it later): a run never needs the network or credentials to start. ``WANDB_MODE=online`` (with
``wandb login`` or ``WANDB_API_KEY``) logs live; ``WANDB_PROJECT`` (default ``sandrl``), ``WANDB_ENTITY``
and ``WANDB_DIR`` are read by wandb itself. The run is named after the output directory; the
resolved config is its config; each step's sample episodes are the ``episodes`` table.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sandrl.train.trackers.episodes import COLUMNS, EpisodeRow

ADVICE = "for W&B online, `wandb login` (or WANDB_API_KEY); or set WANDB_MODE=offline and `wandb sync` later"
PROJECT = "sandrl"


class WandbTracker:
    name = "wandb"

    def __init__(self, output_dir: Path, run_name: str) -> None:
        import wandb

        self._wandb = wandb
        self.mode = os.environ.get("WANDB_MODE") or "offline"
        self._run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or PROJECT,
            name=run_name,
            # wandb's own WANDB_DIR, when set, wins over the run's directory.
            dir=os.environ.get("WANDB_DIR") or str(output_dir),
            mode=self.mode,  # type: ignore[arg-type]
            # console="off": wandb would otherwise rewire the process's stdout and stderr under the progress bar.
            settings=wandb.Settings(console="off", silent=True),
        )

    @property
    def location(self) -> str:
        files = getattr(self._run, "dir", "")  # the run's files/, in the run's own directory
        where = f" ({Path(files).parent})" if files else ""
        return f"{self.mode} run {self._run.id}{where}"

    def log_config(self, config: Mapping[str, Any]) -> None:
        self._run.config.update(dict(config), allow_val_change=True)  # type: ignore[no-untyped-call]

    def log_step(self, step: int, metrics: Mapping[str, float], episodes: Sequence[EpisodeRow]) -> None:
        data: dict[str, Any] = dict(metrics)
        if episodes:
            data["episodes"] = self._wandb.Table(columns=list(COLUMNS), data=[e.values() for e in episodes])
        self._run.log(data, step=step)

    def close(self, finished: bool) -> None:
        self._run.finish(exit_code=0 if finished else 1)


def open_tracker(output_dir: Path, run_name: str) -> WandbTracker:
    return WandbTracker(output_dir, run_name)
