"""Training checkpoints: everything a run needs to continue bit for bit after a crash.

A checkpoint is a directory ``<root>/step-00000012/``::

    model/          the policy, as save_weights writes it (so a checkpoint can also be served)
    reference/      the KL reference policy, when the loss has one
    optimizer.pt    AdamW's state (moments and step counts)
    rng.pt          the random generators: torch (CPU and accelerators), Python's, NumPy's
    state.json      counters (steps, weight version, data position) and the config it trained with

It is written in a hidden staging directory and renamed into place, so after a ``kill -9`` at
any moment the newest ``step-*`` directory is complete; :func:`latest` finds it.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sandrl.errors import TrainError
from sandrl.inference.model import load_weights, save_weights
from sandrl.inference.tokenizer import Tokenizer

FORMAT = 1
_PREFIX = "step-"
_STAGING = ".staging-"


@dataclass(frozen=True)
class TrainerState:
    """The trainer's counters, saved in ``state.json``."""

    steps: int
    """Batches consumed (``step`` and ``sft_step`` calls)."""
    version: int
    """Optimizer updates so far: the weight version of the exported policy."""
    data_position: int
    """Where the driver's data stream stands; the trainer only saves and restores it."""
    config: dict[str, Any]
    data_done: tuple[int, ...] = ()
    """Positions above ``data_position`` already consumed (the async driver trains groups as they
    finish, not in data order): a resumed run skips them instead of training them twice."""


def save(
    root: str | Path,
    state: TrainerState,
    *,
    model: Any,
    optimizer: torch.optim.Optimizer,
    tokenizer: Tokenizer | None = None,
    reference: Any = None,
    keep: int = 2,
) -> Path:
    """Write a checkpoint for ``state.steps`` under ``root``, then delete all but the newest ``keep``."""
    base = Path(root)
    base.mkdir(parents=True, exist_ok=True)
    for stale in base.glob(f"{_STAGING}*"):  # left by a crash mid-save
        shutil.rmtree(stale, ignore_errors=True)
    target = base / f"{_PREFIX}{state.steps:08d}"
    staging = Path(tempfile.mkdtemp(prefix=_STAGING, dir=base))
    try:
        save_weights(model, staging / "model", tokenizer)
        if reference is not None:
            save_weights(reference, staging / "reference")
        torch.save(optimizer.state_dict(), staging / "optimizer.pt")
        torch.save(capture_rng(), staging / "rng.pt")
        record = {
            "format": FORMAT,
            "steps": state.steps,
            "version": state.version,
            "data_position": state.data_position,
            "data_done": list(state.data_done),
            "config": state.config,
        }
        (staging / "state.json").write_text(json.dumps(record, indent=2) + "\n")
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    for old in sorted(base.glob(f"{_PREFIX}*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return target


def latest(root: str | Path) -> Path | None:
    """The newest complete checkpoint under ``root``, or None if there is none yet."""
    base = Path(root)
    if not base.is_dir():
        return None
    found = sorted(p for p in base.glob(f"{_PREFIX}*") if (p / "state.json").is_file())
    return found[-1] if found else None


def steps_done(root: str | Path) -> int:
    """The steps the newest complete checkpoint under ``root`` holds; 0 when there is none."""
    last = latest(root)
    if last is None:
        return 0
    try:
        return int(json.loads((last / "state.json").read_text())["steps"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise TrainError(f"{last} is not a training checkpoint (no readable state.json): {exc}") from exc


def load(
    path: str | Path, *, model: Any, optimizer: torch.optim.Optimizer, reference: Any = None, device: torch.device
) -> TrainerState:
    """Restore the checkpoint at ``path`` into ``model``, ``optimizer`` (and ``reference``) and the RNGs."""
    where = Path(path)
    try:
        record = json.loads((where / "state.json").read_text())
    except (OSError, ValueError) as exc:
        raise TrainError(f"{where} is not a training checkpoint (no readable state.json): {exc}") from exc
    if record.get("format") != FORMAT:
        raise TrainError(
            f"{where}: checkpoint format {record.get('format')!r} is not {FORMAT}; it was written by another sandrl"
        )
    model.load_state_dict(load_weights(model, str(where / "model")))
    if reference is not None:
        if not (where / "reference").is_dir():
            raise TrainError(f"{where} has no reference model, but this run's loss has a KL term (beta > 0)")
        reference.load_state_dict(load_weights(reference, str(where / "reference")))
    optimizer.load_state_dict(torch.load(where / "optimizer.pt", map_location=device, weights_only=True))
    restore_rng(torch.load(where / "rng.pt", weights_only=True))
    return TrainerState(
        steps=int(record["steps"]),
        version=int(record["version"]),
        data_position=int(record["data_position"]),
        config=dict(record.get("config", {})),
        data_done=tuple(int(p) for p in record.get("data_done", ())),
    )


def capture_rng() -> dict[str, Any]:
    """The state of every random generator a run draws from, as tensors and plain values."""
    py_version, py_state, py_gauss = random.getstate()
    np_state: Any = np.random.get_state(legacy=True)
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np_state
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": [py_version, torch.tensor(py_state, dtype=torch.int64), py_gauss],
        "numpy": [np_name, torch.from_numpy(np_keys.astype(np.int64)), np_pos, np_has_gauss, np_gauss],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Put back what :func:`capture_rng` took."""
    torch.set_rng_state(state["torch"])
    py_version, py_state, py_gauss = state["python"]
    random.setstate((py_version, tuple(int(x) for x in py_state.tolist()), py_gauss))
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = state["numpy"]
    np.random.set_state((np_name, np_keys.numpy().astype(np.uint32), np_pos, np_has_gauss, np_gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
