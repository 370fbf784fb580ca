"""``[train] on_truncated`` in a real ``sandrl train`` run: the step's metrics say what was cut and masked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sandrl.cli import app
from sandrl.rollout.jsonl import read_jsonl, write_jsonl
from sandrl.rollout.trajectory import Trajectory

from .conftest import write_saved_groups

CONFIG = """
[run]
output_dir = "out"
steps = 2
groups_per_step = 1

[tasks]
family = "echo"

[rollout]
max_turns = 4

[train]
on_truncated = "{policy}"
"""


@pytest.mark.parametrize("policy", ["train", "mask"])
def test_a_run_counts_the_episodes_a_budget_cut_and_masks_them_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy: str
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("run.toml").write_text(CONFIG.format(policy=policy))
    saved = list(read_jsonl(write_saved_groups(tmp_path / "saved.jsonl", groups=2)))
    # Each group: one finished episode, one the token budget cut (both scored, rewards 0 and 1).
    cut = [
        Trajectory.from_dict({**t.to_dict(), "status": "truncated", "stop_reason": "max_tokens"})
        if t.sample_index == 1
        else t
        for t in saved
    ]
    write_jsonl(tmp_path / "cut.jsonl", cut)
    result = CliRunner().invoke(app, ["train", "run.toml", "--load-rollouts", "cut.jsonl"])
    assert result.exit_code == 0, result.output
    steps = [json.loads(line) for line in Path("out/metrics.jsonl").read_text().splitlines()]
    assert [m["truncated_max_tokens"] for m in steps] == [1, 1]
    masked = 1 if policy == "mask" else 0
    assert [m["truncated_masked"] for m in steps] == [masked, masked]
    # Masked, the cut episode still sets its group's baseline but trains no token.
    assert [m["samples_trained"] for m in steps] == [2 - masked, 2 - masked]
