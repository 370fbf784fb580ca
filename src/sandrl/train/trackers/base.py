"""What a tracker is, and a step's record as the flat numbers every tracker takes.

A step's record (the line of ``metrics.jsonl``) holds numbers, strings (``mode``) and small tables
(``staleness_hist``: staleness -> count). Trackers take numbers under names: a table becomes one
number per entry (``staleness_hist/1``), a string or anything else is left out, and names like
``train/stale_1/mismatch_kl`` stay as they are (TensorBoard and W&B group them by their ``/``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from sandrl.train.trackers.episodes import EpisodeRow

NOT_METRICS = frozenset({"step", "time"})
"""In every record, but not curves: the step is each point's x, and each tracker stamps its own time."""


class Tracker(Protocol):
    """One experiment tracker a run logs to; every method may raise (the fan-out reports and drops it)."""

    name: str

    @property
    def location(self) -> str:
        """Where it writes, for the run's start line (a directory, or a server's address)."""
        ...

    def log_config(self, config: Mapping[str, Any]) -> None:
        """The run's resolved config (``config.toml`` as nested tables), once, at the start."""

    def log_step(self, step: int, metrics: Mapping[str, float], episodes: Sequence[EpisodeRow]) -> None:
        """One step's metrics (flat, see :func:`scalars`) and a few of its episodes."""

    def close(self, finished: bool) -> None:
        """Flush and let go; ``finished``: the run did all its steps (else it stopped early: Ctrl-C, an error)."""


def scalars(record: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The numbers of ``record``, nested tables flattened with ``/``; strings and the like left out."""
    out: dict[str, float] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if not prefix and key in NOT_METRICS:
            continue
        if isinstance(value, Mapping):
            out.update(scalars(value, f"{name}/"))
        elif isinstance(value, bool | int | float):
            out[name] = float(value)
    return out
