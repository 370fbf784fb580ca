"""``sandrl train CONFIG --set section.key=value --steps N --output-dir DIR`` as a user runs it.

Through the command's entry point in this process (:func:`tests.entry_point.run_sandrl`), training the
tiny model on saved trajectories (``--load-rollouts``: no sandboxes, no server); the device tests run
the installed command in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from sandrl.errors import ConfigError
from sandrl.rollout.jsonl import read_jsonl, write_jsonl
from sandrl.rollout.trajectory import Trajectory
from sandrl.train.device import CUDA_INSTALL
from sandrl.train.run_config import load_run_config

from ..entry_point import run_sandrl
from .conftest import write_saved_groups

SANDRL = Path(sys.executable).with_name("sandrl")


def sandrl(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SANDRL), *args], cwd=cwd, capture_output=True, text=True, timeout=300, env={**os.environ}
    )


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A config in ``conf/`` (output_dir relative) and four saved groups to train on, in ``tmp_path``."""
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "run.toml").write_text(
        '[run]\noutput_dir = "runs/x"\nsteps = 5\ngroups_per_step = 1\n[tasks]\nfamily = "echo"\n'
    )
    write_saved_groups(tmp_path / "saved.jsonl")
    return tmp_path


Sandrl = Callable[..., subprocess.CompletedProcess[str]]
"""``sandrl ARGS`` in ``cwd``, run by :func:`sandrl.cli.main` in this process."""


@pytest.fixture
def sandrl_here(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Sandrl:
    def run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
        return run_sandrl(list(args), cwd=cwd, monkeypatch=monkeypatch, capsys=capsys)

    return run


@pytest.fixture
def train(sandrl_here: Sandrl) -> Sandrl:
    def run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
        return sandrl_here(cwd, "train", "conf/run.toml", "--load-rollouts", "saved.jsonl", *args)

    return run


def test_set_and_steps_shape_the_run_and_output_dir_is_relative_to_the_working_directory(
    run_dir: Path, train: Sandrl
) -> None:
    r = train(run_dir, "--steps", "1", "--set", "train.lr=3e-5", "--set", "train.loss.loss_type=grpo",
              "--set", "train.max_grad_norm=false", "--set", "run.seed=7")  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = run_dir / "runs" / "x"  # not conf/runs/x
    resolved = tomllib.loads((out / "config.toml").read_text())
    assert resolved["run"]["output_dir"] == str(out)
    assert resolved["run"]["steps"] == 1 and resolved["run"]["seed"] == 7
    assert resolved["train"]["lr"] == 3e-5 and resolved["train"]["max_grad_norm"] is False
    assert resolved["train"]["loss"]["loss_type"] == "grpo"
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 1
    assert json.loads(r.stdout.splitlines()[-1])["train/lr"] == 3e-5


def test_a_finished_run_says_it_is_complete_and_steps_extends_it(run_dir: Path, train: Sandrl) -> None:
    first = train(run_dir, "--steps", "1", "--output-dir", "elsewhere")
    assert first.returncode == 0, first.stderr
    metrics = run_dir / "elsewhere" / "metrics.jsonl"
    again = train(run_dir, "--steps", "1", "--output-dir", "elsewhere")
    assert again.returncode == 0, again.stderr
    assert f"the run in {run_dir / 'elsewhere'} is complete: 1 of 1 steps done, nothing trained now" in again.stderr
    assert "--steps 2" in again.stderr and "step 1/1" not in again.stderr
    assert json.loads(again.stdout.splitlines()[-1])["complete"] is True
    assert len(metrics.read_text().splitlines()) == 1
    more = train(run_dir, "--steps", "2", "--output-dir", "elsewhere")
    assert more.returncode == 0, more.stderr
    assert "step 2/2" in more.stderr
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [1, 2]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--set", "run.stepz=3"], "--set run.stepz=3: [run]: unknown key stepz; valid keys are output_dir, mode"),
        (["--set", "train.loss.kind=x"], "[train.loss]: unknown key kind; valid keys are"),
        (["--set", "trian.lr=1"], "--set trian.lr=1: unknown section trian; valid sections are run, model"),
        (["--set", "train.lr=fast"], "--set train.lr=fast: train.lr must be a number, got 'fast'"),
        (["--set", "run.steps=3.5"], "run.steps must be an integer, got '3.5'"),
        (["--set", "run.resume=yes"], "run.resume must be true or false, got 'yes'"),
        (["--set", "steps=3"], "--set takes section.key=value (e.g. run.steps=40), got 'steps=3'"),
        (["--set", "train.loss=dapo"], "[train.loss] is a table: set one of its keys"),
        (["--set", "train.loss.loss_type=ppo"], "[train.loss] loss_type must be one of"),
        (["--steps", "0"], "[run]: steps must be >= 1, got 0"),
        (["--set", "train.processes=0"], "processes must be >= 1 (the training ranks: 1, or one per GPU), got 0"),
        (["--set", "train.dtype=fp8"], "[train] dtype must be one of 'fp32', 'bf16', got 'fp8'"),
        (["--set", "train.lora.rank=0"], "[train.lora]: rank must be >= 1"),
        (["--set", "train.offload_optimizer=true"], 'with device = "cpu" they are there already'),
        (["--set", "train.lora.target_modules=q_proj,qkv"], "[train.lora] target_modules: "),
    ],
)
def test_a_bad_override_is_one_clear_line(run_dir: Path, train: Sandrl, args: list[str], said: str) -> None:
    r = train(run_dir, *args)
    assert r.returncode == 2, r
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert said in r.stderr, r.stderr
    assert not (run_dir / "runs").exists()


def test_a_run_started_beside_its_config_goes_on_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Before, output_dir was relative to the config file: such a run resumes where it is, with a warning.
    config = tmp_path / "conf" / "run.toml"
    (tmp_path / "conf" / "runs" / "x").mkdir(parents=True)
    (tmp_path / "conf" / "runs" / "x" / "config.toml").write_text("")
    config.write_text('[run]\noutput_dir = "runs/x"\n[tasks]\nfamily = "echo"\n')
    monkeypatch.chdir(tmp_path)
    with pytest.warns(UserWarning, match="relative to the working directory now"):
        assert load_run_config(config).run.output_dir == str(tmp_path / "conf" / "runs" / "x")
    (tmp_path / "runs" / "x").mkdir(parents=True)  # a run at the new place wins
    assert load_run_config(config).run.output_dir == str(tmp_path / "runs" / "x")
    with pytest.raises(ConfigError, match="output_dir must name a directory"):
        load_run_config(config, ["run.output_dir="])


CPU_ONLY = torch.version.cuda is None and getattr(torch.version, "hip", None) is None


@pytest.mark.parametrize(
    ("device", "said"),
    [
        pytest.param(
            "cuda",
            f"[train] device = 'cuda', but the installed torch {torch.__version__} is a CPU-only build: "
            f'install a CUDA build ({CUDA_INSTALL}) or set device = "cpu"',
            marks=pytest.mark.skipif(not CPU_ONLY, reason="this torch is a CUDA build"),
        ),
        (
            "cdua",
            "[train] device = 'cdua' is not a torch device: write cpu, cuda, cuda:N or mps (any torch device type)",
        ),
    ],
)
def test_a_device_this_torch_cannot_use_is_one_line_naming_the_fix(run_dir: Path, device: str, said: str) -> None:
    # It was a 164-line traceback from deep inside model.to().
    r = sandrl(run_dir, "train", "conf/run.toml", "--load-rollouts", "saved.jsonl", "--set", f"train.device={device}")
    assert r.returncode == 2, r
    assert r.stderr == f"error: {said}\n"
    assert not (run_dir / "runs").exists()  # checked before the run writes anything


def test_a_run_without_reward_signal_says_so_and_then_what_to_change(run_dir: Path, sandrl_here: Sandrl) -> None:
    """Every group all-failed: nothing trains, and the run used to print only 'trained 0/1 groups'."""
    flat = [Trajectory.from_dict({**t.to_dict(), "reward": 0.0}) for t in read_jsonl(run_dir / "saved.jsonl")]
    write_jsonl(run_dir / "flat.jsonl", flat)
    r = sandrl_here(run_dir, "train", "conf/run.toml", "--load-rollouts", "flat.jsonl", "--steps", "4")
    assert r.returncode == 0, r.stderr
    steps = [line for line in r.stderr.splitlines() if line.startswith("step ")]
    assert len(steps) == 4
    assert all("no reward signal: 1 groups all failed, 0 all passed" in line for line in steps), steps
    advice = [line for line in r.stderr.splitlines() if "steps in a row trained nothing" in line]
    assert len(advice) == 1, r.stderr  # once per streak
    assert "too hard for this policy" in advice[0] and "[rollout] group_size" in advice[0]
    metrics = [json.loads(line) for line in (run_dir / "runs" / "x" / "metrics.jsonl").read_text().splitlines()]
    assert [m["groups_all_fail"] for m in metrics] == [1, 1, 1, 1]
