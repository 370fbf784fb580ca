"""TensorBoard: event files under ``<output_dir>/tensorboard``, written by torch's ``SummaryWriter``.

Each metric is a scalar curve; the resolved config is one text entry at step 0. TensorBoard has no
table, so the sample episodes go to the trackers that have one (W&B, MLflow) and to ``rollouts.jsonl``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sandrl.train.trackers.episodes import EpisodeRow

ADVICE = "check that the disk under the run's output_dir has room and is writable"


class TensorBoardTracker:
    name = "tensorboard"

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = log_dir
        self._writer = SummaryWriter(log_dir=str(log_dir))

    @property
    def location(self) -> str:
        return f"{self.log_dir} (tensorboard --logdir {self.log_dir})"

    def log_config(self, config: Mapping[str, Any]) -> None:
        # Indented four spaces: TensorBoard renders text as Markdown, where that is a code block.
        text = "\n".join("    " + line for line in json.dumps(config, indent=2).splitlines())
        self._writer.add_text("config", text, 0)

    def log_step(self, step: int, metrics: Mapping[str, float], episodes: Sequence[EpisodeRow]) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def close(self, finished: bool) -> None:
        self._writer.close()


def open_tracker(output_dir: Path, run_name: str) -> TensorBoardTracker:
    return TensorBoardTracker(output_dir / "tensorboard")
