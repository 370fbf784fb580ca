"""``sandrl train CONFIG --warm-start`` and ``[warm_start]`` as a user runs them.

The real command, in this process (``CliRunner``); RL trains on saved trajectories
(``--load-rollouts``: no sandboxes, no server) and the warm start is a few updates of a very small
model, so each run takes a second or two. The last test runs episodes in real sandboxes against a
real inference server.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import torch
from click.testing import Result
from typer.testing import CliRunner

from sandrl.cli import app
from sandrl.errors import ConfigError
from sandrl.inference.engine import Engine, EngineConfig
from sandrl.inference.model import build_tiny_model, load_model
from sandrl.inference.server import BackgroundServer, create_app
from sandrl.inference.tiny_config import TinyModelConfig
from sandrl.rollout.jsonl import read_jsonl
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.train import checkpoint
from sandrl.train.command import run_training

from .conftest import ParityAgent, run_config, write_saved_groups

CONFIG = """
[run]
output_dir = "runs/x"
steps = 1
groups_per_step = 1

[tasks]
family = "echo"
seed = 5

[train]
lr = 1e-6

[warm_start]
steps = 4
batch_size = 2
demonstrations = 4
checks = 2
check_every = 2

[warm_start.tiny]
hidden_size = 32
num_layers = 1
num_heads = 2
num_kv_heads = 1
intermediate_size = 64
max_position_embeddings = 256
"""
TINY = TinyModelConfig(
    hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64, max_position_embeddings=256
)


def sandrl(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def error(result: Result) -> str:
    """The message of the ConfigError the command stopped with (``sandrl`` prints it as one line)."""
    assert isinstance(result.exception, ConfigError), result.output
    assert "\n" not in result.exception.message
    return result.exception.message


@pytest.fixture
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The config in ``conf/`` and two saved groups to train on, in ``tmp_path``, the working directory."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "run.toml").write_text(CONFIG)
    write_saved_groups(tmp_path / "saved.jsonl")
    return tmp_path


def train(*args: str) -> Result:
    return sandrl("train", "conf/run.toml", "--load-rollouts", "saved.jsonl", *args)


def _distance(a: torch.nn.Module, b: torch.nn.Module) -> float:
    theirs = b.state_dict()
    return max(float((v - theirs[k]).abs().max()) for k, v in a.state_dict().items())


def test_warm_start_fine_tunes_once_then_rl_trains_from_it(run_dir: Path) -> None:
    out = run_dir / "runs" / "x"
    r = train("--warm-start")
    assert r.exit_code == 0, r.output
    assert "warm start: up to 4 supervised steps on 4 demonstrations, checked on 2 others every 2 steps" in r.stderr
    assert "warm start 2/4  loss " in r.stderr and "checks: one sample " in r.stderr
    assert "warm start: 4 supervised steps on 4 demonstrations, loss " in r.stderr
    warm = out / "warm_start" / "model"
    result = json.loads((out / "warm_start" / "result.json").read_text())
    assert result["steps"] == 4 and result["demonstrations"] == 4 and result["checks"] == 2
    assert [step for step, _ in result["greedy"]] == [2, 4]
    # The demonstrations are the family's, from a seed of their own: the RL tasks stay unseen.
    demos = sorted(p.name for p in (out / "warm_start" / "tasks" / "demonstrations").iterdir())
    assert demos == [f"echo-3005-{i:04d}" for i in range(4)]
    resolved = tomllib.loads((out / "config.toml").read_text())
    assert resolved["model"]["name"] == str(warm) and resolved["warm_start"]["enabled"] is True
    # RL started from the warm start: one update at lr 1e-6 leaves its weights next to the warm start's.
    last = checkpoint.latest(out / "checkpoints")
    assert last is not None
    rl, warmed, fresh = load_model(str(last / "model"))[0], load_model(str(warm))[0], build_tiny_model(TINY)[0]
    assert _distance(rl, warmed) < 1e-4 < _distance(rl, fresh)

    # A rerun that trains on reuses the warm start: no supervised step is taken again.
    made = (out / "warm_start" / "result.json").stat().st_mtime_ns
    again = train("--warm-start", "--steps", "2")
    assert again.exit_code == 0, again.output
    assert "warm start: 4 supervised steps on 4 demonstrations" in again.stderr
    assert "(made earlier, reused)" in again.stderr and "warm start 2/4" not in again.stderr
    assert "step 2/2" in again.stderr
    assert (out / "warm_start" / "result.json").stat().st_mtime_ns == made

    # The run's own resolved config names the checkpoint and runs again as it is.
    resumed = sandrl("train", str(out / "config.toml"), "--load-rollouts", "saved.jsonl", "--steps", "3")
    assert resumed.exit_code == 0, resumed.output
    assert "step 3/3" in resumed.stderr and "warm start" not in resumed.stderr

    # Other warm start settings would not be what this run trained from: refused, saying how to go on.
    changed = train("--warm-start", "--steps", "4", "--set", "warm_start.lr=1e-3")
    assert error(changed) == (
        f"{out / 'warm_start'} holds a warm start made with other settings (warm_start.lr differs): give "
        f"the run another --output-dir, or delete {out / 'warm_start'} to warm-start it again"
    )


def test_without_the_flag_or_the_key_there_is_no_warm_start(run_dir: Path) -> None:
    r = train()
    assert r.exit_code == 0, r.output
    assert "warm start" not in r.stderr and not (run_dir / "runs" / "x" / "warm_start").exists()
    assert tomllib.loads((run_dir / "runs" / "x" / "config.toml").read_text())["model"]["name"] == "tiny"


def test_a_broken_warm_start_record_says_to_delete_it(run_dir: Path) -> None:
    root = run_dir / "runs" / "x" / "warm_start"
    root.mkdir(parents=True)
    (root / "result.json").write_text("{")
    said = error(train("--warm-start"))
    assert said.startswith(f"cannot read {root / 'result.json'} (")
    assert said.endswith(f"delete {root} to warm-start again")
    (root / "result.json").write_text('{"settings": {}}')
    with_settings = error(train("--warm-start"))
    assert "holds a warm start made with other settings" in with_settings


def test_a_task_set_without_solutions_cannot_be_warm_started(run_dir: Path) -> None:
    task = run_dir / "tasks" / "t1"
    (task / "tests").mkdir(parents=True)
    (task / "instruction.md").write_text("Do it.\n")
    (task / "task.toml").write_text('[environment]\ndocker_image = "host"\n')
    (task / "tests" / "test.sh").write_text("#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n")
    r = train("--warm-start", "--set", "warm_start.path=../tasks", "--set", "warm_start.checks=0")
    said = error(r)
    assert said.startswith("[warm_start]: 0 of the 1 tasks under ") and "solution/solve.sh" in said


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--set", "warm_start.stop_at_sampled=0.3", "--set", "warm_start.checks=0"], "set checks (32 is plenty)"),
        (["--set", "warm_start.demonstrations=0"], "demonstrations must be >= 1"),
        (["--set", "warm_start.stepz=3"], "[warm_start]: unknown key stepz; valid keys are steps, batch_size"),
    ],
)
def test_bad_warm_start_settings_are_one_line(run_dir: Path, args: list[str], said: str) -> None:
    r = train("--warm-start", *args)
    assert said in error(r)


async def test_an_inference_server_samples_from_the_warm_start(
    tmp_path: Path, provider: BwrapProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``[model] inference`` a server's URL, the server is sent the warm-started weights before the
    first episode: it would otherwise sample the run's first steps from the model it was started on."""
    token = "warm-start-test-token-0123456789"
    monkeypatch.setenv("SANDRL_INFERENCE_TOKEN", token)
    served, tokenizer = build_tiny_model()  # the server's model: the default tiny shape, as [warm_start.tiny]'s
    engine = Engine(served, tokenizer, config=EngineConfig(seed=0))
    out = tmp_path / "out"
    try:
        with BackgroundServer(create_app(engine, token=token)) as server:
            config = run_config(
                out,
                run={"steps": 1, "groups_per_step": 1},
                model={"inference": server.url},
                rollout={"group_size": 2},
                warm_start={"enabled": True, "steps": 2, "batch_size": 2, "demonstrations": 2},
            )
            await run_training(config, rollout_only=True, provider=provider, agent=ParityAgent())
    finally:
        engine.close()
    warm = load_model(str(out / "warm_start" / "model"))[0]
    assert _distance(served, warm) == 0.0 < _distance(build_tiny_model()[0], warm)
    versions = {t.weight_version for t in read_jsonl(out / "rollouts.jsonl")}
    assert versions == {0}
