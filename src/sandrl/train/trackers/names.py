"""The trackers ``[run] trackers`` may name, and what each needs installed.

Checked when the config loads, without importing the libraries (they take a second or more each):
an unknown name, or a tracker whose library is missing, is refused before anything runs.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable

from sandrl.errors import ConfigError

JSONL = "jsonl"
"""``<output_dir>/metrics.jsonl``: always written, listed or not."""
REQUIRES: dict[str, tuple[str, ...]] = {
    JSONL: (),
    "tensorboard": ("tensorboard", "torch"),
    "wandb": ("wandb",),
    "mlflow": ("mlflow",),
}
"""Each tracker's name and the modules it imports (torch's ``SummaryWriter`` writes TensorBoard's files)."""
TRACKERS: tuple[str, ...] = tuple(REQUIRES)
INSTALL = "pip install 'sandrl[trackers]'"


def installed(module: str) -> bool:
    """Whether ``module`` can be imported (found on the path), without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def check_trackers(names: Iterable[str]) -> None:
    """Refuse an unknown tracker name, or one whose library is not installed (:class:`ConfigError`)."""
    for name in names:
        if name not in REQUIRES:
            raise ConfigError(f"unknown tracker {name!r}; valid trackers are {', '.join(TRACKERS)}")
        missing = [m for m in REQUIRES[name] if not installed(m)]
        if missing:
            raise ConfigError(
                f"tracker {name!r} needs {', '.join(missing)}, which is not installed: {INSTALL} "
                f"(or drop {name!r} from [run] trackers)"
            )
