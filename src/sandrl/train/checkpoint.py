"""Training checkpoints: everything a run needs to continue bit for bit after a crash.

A checkpoint is a directory ``<root>/step-00000012/``::

    state/          the trainable weights and AdamW's state, sharded, as torch.distributed.checkpoint
                    writes them (each rank its shards; any number of ranks can load them)
    model/          the policy as a Hugging Face checkpoint (safetensors), so a checkpoint can be served
    rng.pt          the random generators: torch (CPU and accelerators), Python's, NumPy's
    state.json      counters (steps, weight version, data position) and the config it trained with

With LoRA, ``state/`` holds the adapters alone (the base never changes) and ``model/`` what
``[train.lora] export`` says. The KL reference is not saved: it is the run's starting policy,
rebuilt from ``[model] name`` (or the policy with its adapters off).

It is written in a hidden staging directory and renamed into place, so after a ``kill -9`` at
any moment the newest ``step-*`` directory is complete; :func:`latest` finds it.
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint import state_dict_loader, state_dict_saver
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from sandrl.errors import TrainError
from sandrl.inference.model import save_weights
from sandrl.inference.tokenizer import Tokenizer
from sandrl.inference.weight_push import model_weights
from sandrl.train.config import TrainConfig
from sandrl.train.world import World

FORMAT = 2
_PREFIX = "step-"
_STAGING = ".staging-"
_POLICY_PREFIX = "lm."
"""The Hugging Face model's keys sit under this prefix in the trainer's policy module."""


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


def export_policy(
    policy: torch.nn.Module,
    model: Any,
    path: Path,
    tokenizer: Tokenizer | None,
    config: TrainConfig,
    world: World,
) -> Path:
    """Write the policy as a servable checkpoint at ``path`` (every rank calls it; rank 0 writes)."""
    if not world.distributed:
        if config.lora is not None:
            from sandrl.train import lora

            return lora.export_lora(model, path, config.lora, tokenizer)
        return save_weights(model, path, tokenizer)
    full: dict[str, Any] = get_model_state_dict(
        policy, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    if world.rank == 0:
        dtype = torch.bfloat16 if config.dtype == "bf16" else torch.float32
        # Adapters stay float32: a server computes with them as they were trained (they are small).
        weights = {k.removeprefix(_POLICY_PREFIX): v if ".lora_" in k else v.to(dtype) for k, v in full.items()}
        if config.lora is not None:
            from sandrl.train import lora

            lora.export_lora(model, path, config.lora, tokenizer, state_dict=weights)
        else:
            # Gathered, tied weights (the head that is the embedding) are two copies: write one, as the
            # model's own save_pretrained does.
            for tied in getattr(model, "all_tied_weights_keys", None) or {}:
                weights.pop(tied, None)
            save_weights(model, path, tokenizer, state_dict=weights)
    dist.barrier()
    return path


def full_weights(
    policy: torch.nn.Module, model: Any, config: TrainConfig, world: World
) -> Iterator[tuple[str, torch.Tensor]]:
    """The policy's weights by name as :func:`export_policy` writes them, one full tensor at a time.

    With several ranks every rank must run the iterator to its end, in step: each sharded tensor is
    gathered by all of them (rank 0 uses it, the others drop it), so no rank ever holds more than one
    full tensor beyond what its consumer keeps."""
    if not world.distributed:
        yield from model_weights(model)
        return
    from torch.distributed.tensor import DTensor

    dtype = torch.bfloat16 if config.dtype == "bf16" else torch.float32
    tied = set(getattr(model, "all_tied_weights_keys", None) or {})
    for key, value in policy.state_dict().items():
        name = key.removeprefix(_POLICY_PREFIX)
        full = value.full_tensor() if isinstance(value, DTensor) else value
        if name not in tied:
            yield name, full.to(dtype)


def save(
    root: str | Path,
    state: TrainerState,
    *,
    policy: torch.nn.Module,
    model: Any,
    optimizer: torch.optim.Optimizer,
    config: TrainConfig,
    world: World,
    tokenizer: Tokenizer | None = None,
) -> Path:
    """Write a checkpoint for ``state.steps`` under ``root`` (every rank calls it), then keep the newest few."""
    base = Path(root)
    target = base / f"{_PREFIX}{state.steps:08d}"
    staging = base / f"{_STAGING}{state.steps:08d}"
    if world.rank == 0:
        base.mkdir(parents=True, exist_ok=True)
        for stale in base.glob(f"{_STAGING}*"):  # left by a crash mid-save
            shutil.rmtree(stale, ignore_errors=True)
        staging.mkdir()
    _barrier(world)
    try:
        model_state, optim_state = _train_state(policy, optimizer, config)
        with _single_process_quiet():
            state_dict_saver.save(
                {"model": model_state, "optim": optim_state},
                checkpoint_id=staging / "state",
                no_dist=not world.distributed,
            )
        export_policy(policy, model, staging / "model", tokenizer, config, world)
        if world.rank == 0:
            torch.save(capture_rng(), staging / "rng.pt")
            record = {
                "format": FORMAT,
                "steps": state.steps,
                "version": state.version,
                "data_position": state.data_position,
                "data_done": list(state.data_done),
                "ranks": world.size,
                "config": state.config,
            }
            (staging / "state.json").write_text(json.dumps(record, indent=2) + "\n")
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
    except BaseException:
        if world.rank == 0:
            shutil.rmtree(staging, ignore_errors=True)
        raise
    if world.rank == 0:
        for old in sorted(base.glob(f"{_PREFIX}*"))[: -config.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)
    _barrier(world)
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
    return read_state(last).steps


def read_state(path: str | Path) -> TrainerState:
    """The counters of the checkpoint at ``path``, checked to be one this sandrl can resume."""
    where = Path(path)
    try:
        record = json.loads((where / "state.json").read_text())
        if record.get("format") != FORMAT:
            raise TrainError(
                f"{where}: checkpoint format {record.get('format')!r} is not {FORMAT}; it was written by another "
                "sandrl version: resume it with that version, or start a new run (--output-dir)"
            )
        return TrainerState(
            steps=int(record["steps"]),
            version=int(record["version"]),
            data_position=int(record["data_position"]),
            config=dict(record.get("config", {})),
            data_done=tuple(int(p) for p in record.get("data_done", ())),
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise TrainError(f"{where} is not a training checkpoint (no readable state.json): {exc}") from exc


def load(
    path: str | Path, *, policy: torch.nn.Module, optimizer: torch.optim.Optimizer, config: TrainConfig
) -> TrainerState:
    """Restore the checkpoint at ``path`` into ``policy`` and ``optimizer`` (this rank's shards) and the RNGs."""
    where = Path(path)
    state = read_state(where)
    model_state, optim_state = _train_state(policy, optimizer, config)
    try:
        with _single_process_quiet():
            state_dict_loader.load(
                {"model": model_state, "optim": optim_state},
                checkpoint_id=where / "state",
                no_dist=not World.current().distributed,
            )
    except Exception as exc:
        raise TrainError(
            f"{where}: its weights and optimizer state do not fit this run's model ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}); resume with the config it was written with "
            "(its state.json), or start a new run (--output-dir)"
        ) from exc
    set_state_dict(
        policy, optimizer, model_state_dict=model_state, optim_state_dict=optim_state, options=_options(config)
    )
    restore_rng(torch.load(where / "rng.pt", weights_only=True))
    return state


def _train_state(
    policy: torch.nn.Module, optimizer: torch.optim.Optimizer, config: TrainConfig
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The model's and the optimizer's state dicts as a checkpoint holds them (with LoRA: the adapters)."""
    model_state, optim_state = get_state_dict(policy, optimizer, options=_options(config))
    if config.lora is not None:
        # A frozen weight tied to another (the head that is the embedding) slips past ignore_frozen_params.
        trainable = {n for n, p in policy.named_parameters(remove_duplicate=False) if p.requires_grad}
        model_state = {k: v for k, v in model_state.items() if k in trainable}
    return model_state, optim_state


def _options(config: TrainConfig) -> StateDictOptions:
    # With LoRA the base is frozen and rebuilt from [model] name: only the adapters are state.
    lora = config.lora is not None
    return StateDictOptions(ignore_frozen_params=lora, strict=not lora)


@contextlib.contextmanager
def _single_process_quiet() -> Iterator[None]:
    """DCP warns that it "assumes" one process when there is no process group: here that is the intent."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


def _barrier(world: World) -> None:
    if world.distributed:
        dist.barrier()


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
