"""MLflow: a file store under ``<output_dir>/mlruns`` unless ``MLFLOW_TRACKING_URI`` names a server.

Through :class:`mlflow.tracking.MlflowClient` (no global active run): the experiment is
``MLFLOW_EXPERIMENT_NAME`` (default ``sandrl``), the run is named after the output directory, the
resolved config is its params (``run.steps``...) and ``config.json``, each step's metrics one batch,
and each step's sample episodes the artifact ``episodes/step_000001.json`` (``columns`` and ``data``,
as MLflow's own tables are written). MLflow 3 keeps its file store but refuses it unless
``MLFLOW_ALLOW_FILE_STORE`` is set: with no tracking URI given, it is set for this process.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from sandrl.train.trackers.episodes import COLUMNS, EpisodeRow

ADVICE = "check that the server at MLFLOW_TRACKING_URI answers (or unset it to log to <output_dir>/mlruns)"
EXPERIMENT = "sandrl"
PARAM_CHARS = 500
"""Characters of a config value kept as a param (MLflow refuses long ones; config.json has them whole)."""
BATCH_METRICS = 1000
BATCH_PARAMS = 100
"""The most metrics and params MLflow takes in one ``log_batch``."""
_NOT_IN_A_KEY = re.compile(r"[^\w\-. /]")


class MlflowTracker:
    name = "mlflow"

    def __init__(self, output_dir: Path, run_name: str) -> None:
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            uri = (output_dir / "mlruns").resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient

        self.uri = uri
        self._client = MlflowClient(tracking_uri=uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or EXPERIMENT
        experiment = self._client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment is not None else self._client.create_experiment(name)
        self.run_id: str = self._client.create_run(experiment_id, run_name=run_name).info.run_id

    @property
    def location(self) -> str:
        return f"{self.uri} (run {self.run_id})"

    def log_config(self, config: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(key_of(k), str(v)[:PARAM_CHARS]) for k, v in _flat(config)]
        for start in range(0, len(params), BATCH_PARAMS):
            self._client.log_batch(self.run_id, params=params[start : start + BATCH_PARAMS])
        self._client.log_dict(self.run_id, dict(config), "config.json")

    def log_step(self, step: int, metrics: Mapping[str, float], episodes: Sequence[EpisodeRow]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(key_of(k), v, now, step) for k, v in metrics.items()]
        for start in range(0, len(batch), BATCH_METRICS):
            self._client.log_batch(self.run_id, metrics=batch[start : start + BATCH_METRICS])
        if episodes:
            table = {"columns": list(COLUMNS), "data": [e.values() for e in episodes]}
            self._client.log_dict(self.run_id, table, f"episodes/step_{step:06d}.json")

    def close(self, finished: bool) -> None:
        self._client.set_terminated(self.run_id, "FINISHED" if finished else "KILLED")


def key_of(name: str) -> str:
    """``name`` as MLflow takes a metric or param name: letters, digits, ``_ - . / `` and space."""
    return _NOT_IN_A_KEY.sub("_", name)


def _flat(config: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in config.items():
        if isinstance(value, Mapping):
            yield from _flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def open_tracker(output_dir: Path, run_name: str) -> MlflowTracker:
    return MlflowTracker(output_dir, run_name)
