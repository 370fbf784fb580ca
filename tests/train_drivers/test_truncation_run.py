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


ESTIMATORS = [
    "",
    '[train.loss]\nestimator = "gspo"\nadvantage = "rloo"\nscale_rewards = "none"\n'
    '[train.loss.is]\nlevel = "geometric"\n',
    '[train.loss]\nestimator = "cispo"\nadvantage = "reinforce_pp"\nentropy_coef = 0.01\n',
    '[train.loss]\nadvantage = "reinforce_pp_baseline"\n[train.loss.is]\nmode = "mask"\nband = [0.5, 2.0]\n',
]


@pytest.mark.parametrize("loss", ESTIMATORS, ids=["grpo", "gspo-rloo", "cispo-reinforce-pp", "mis-baseline"])
def test_each_estimator_trains_and_its_step_says_the_new_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, loss: str
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("run.toml").write_text(CONFIG.format(policy="train") + loss)
    write_saved_groups(tmp_path / "saved.jsonl", groups=2)
    result = CliRunner().invoke(app, ["train", "run.toml", "--load-rollouts", "saved.jsonl"])
    assert result.exit_code == 0, result.output
    last = json.loads(Path("out/metrics.jsonl").read_text().splitlines()[-1])
    for key in ("mismatch_kl", "is_masked_frac", "entropy_mean", "stale_1/mismatch_kl", "stop_unknown/reward_mean"):
        assert f"train/{key}" in last, key
    # Rewards 0 and 1 in each group: GRPO's advantages are +-0.707 (the group's std), RLOO's unscaled +-1.
    expected = {"": 0.7071, "rloo": 1.0}.get("rloo" if "rloo" in loss else loss)
    if expected is not None:
        assert last["train/advantage_abs_mean"] == pytest.approx(expected, abs=1e-3)


def test_scale_rewards_said_in_rollout_is_the_losss_and_the_two_may_not_differ(tmp_path: Path) -> None:
    from sandrl.errors import ConfigError
    from sandrl.train.run_config import load_run_config

    path = tmp_path / "run.toml"
    path.write_text('[tasks]\nfamily = "echo"\n[rollout]\nscale_rewards = "batch"\n')
    assert load_run_config(path).train.loss.scale_rewards == "batch"
    path.write_text('[tasks]\nfamily = "echo"\n[train.loss]\nscale_rewards = "none"\n')
    config = load_run_config(path)
    assert config.train.loss.scale_rewards == config.rollout.scale_rewards == "none"
    both = '[rollout]\nscale_rewards = "batch"\n[train.loss]\nscale_rewards = "none"\n'
    path.write_text('[tasks]\nfamily = "echo"\n' + both)
    with pytest.raises(ConfigError, match=r"\[rollout\] scale_rewards = 'batch' but \[train.loss\] scale_rewards"):
        load_run_config(path)
