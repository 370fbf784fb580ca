"""Checkpoints: a run resumed after kill -9 at a random step ends bit for bit where an uninterrupted one does."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from sandrl.errors import TrainError
from sandrl.train import checkpoint

from .helpers import make_trainer, same_tensors, state_of
from .resume_worker import CONFIG, run

ROOT = Path(__file__).resolve().parents[2]
STEPS = 10


def _worker(directory: Path, *, resume: bool = False) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "tests.train.resume_worker", str(directory), "--steps", str(STEPS)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    return subprocess.Popen(
        [*cmd, *(["--resume"] if resume else [])],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def _finish(proc: subprocess.Popen[str]) -> None:
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0 and out.rstrip().endswith("done"), out


def _final(directory: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    last = checkpoint.latest(directory)
    assert last is not None and last.name == f"step-{STEPS:08d}"
    flat = directory / "state.pt"
    dcp_to_torch_save(last / "state", flat)
    optimizer = torch.load(flat, weights_only=True)["optim"]
    return load_file(str(next((last / "model").glob("*.safetensors")))), optimizer


def test_resume_after_kill_9_at_a_random_step_continues_bit_for_bit(tmp_path: Path) -> None:
    seed = random.randrange(1 << 30)
    chooser = random.Random(seed)
    kill_after = chooser.randrange(1, STEPS - 4)
    delay = chooser.uniform(0, 0.03)  # the kill lands mid-step or mid-save
    note = f"(kill after step {kill_after} + {delay * 1000:.0f} ms; seed {seed})"

    baseline = _worker(tmp_path / "straight")
    interrupted = _worker(tmp_path / "interrupted")
    assert interrupted.stdout is not None
    for line in interrupted.stdout:
        if line.strip() == f"saved {kill_after}":
            break
    time.sleep(delay)
    interrupted.send_signal(signal.SIGKILL)
    interrupted.wait(timeout=30)
    interrupted.stdout.close()
    assert interrupted.returncode == -signal.SIGKILL, note
    last = checkpoint.latest(tmp_path / "interrupted")
    assert last is not None and int(last.name.split("-")[1]) < STEPS, note

    _finish(_worker(tmp_path / "interrupted", resume=True))
    _finish(baseline)
    (model_a, optim_a), (model_b, optim_b) = _final(tmp_path / "straight"), _final(tmp_path / "interrupted")
    assert same_tensors(model_a, model_b), note
    state_a, state_b = optim_a["state"], optim_b["state"]
    assert state_a.keys() == state_b.keys(), note
    for key in state_a:
        assert all(torch.equal(state_a[key][k], state_b[key][k]) for k in state_a[key]), note


def test_a_checkpoint_restores_model_optimizer_counters_and_rng(tmp_path: Path) -> None:
    straight = run(tmp_path / "a", 4, resume=False)
    rng_straight = checkpoint.capture_rng()
    run(tmp_path / "b", 2, resume=False)
    resumed = run(tmp_path / "b", 4, resume=True)
    rng_resumed = checkpoint.capture_rng()
    assert (resumed.steps, resumed.version, resumed.data_position) == (4, straight.version, 4)
    assert same_tensors(state_of(straight.model), state_of(resumed.model))
    assert torch.equal(rng_straight["torch"], rng_resumed["torch"])
    assert torch.equal(rng_straight["python"][1], rng_resumed["python"][1])
    assert torch.equal(rng_straight["numpy"][1], rng_resumed["numpy"][1])
    kept = sorted(p.name for p in (tmp_path / "b").iterdir())
    assert kept == ["step-00000003", "step-00000004"]  # keep_checkpoints = 2


def test_a_leftover_staging_directory_is_ignored_and_cleaned(tmp_path: Path) -> None:
    trainer = make_trainer(CONFIG)
    (tmp_path / ".staging-crashed").mkdir(parents=True)
    assert checkpoint.latest(tmp_path) is None
    trainer.save_checkpoint(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000000"]


def test_a_directory_that_is_not_a_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TrainError, match="not a training checkpoint"):
        make_trainer(CONFIG).load_checkpoint(tmp_path)
