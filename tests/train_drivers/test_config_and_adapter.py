"""The run config (checked on load, saved resolved) and the Trajectory -> TrainSample adapter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandrl.errors import ConfigError
from sandrl.rollout.trajectory import Trajectory
from sandrl.train.adapter import batch_from_groups
from sandrl.train.run_config import load_run_config, save_resolved

from ..bench.conftest import synthetic_result

REPO = Path(__file__).resolve().parents[2]


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('[tasks]\nfamily = "echo"\n[trian]\nlr = 1\n', "unknown section(s) trian"),
        ('[tasks]\nfamily = "echo"\n[run]\nstep = 3\n', "[run]: unknown key(s) step"),
        ('[tasks]\nfamily = "echo"\n[run]\nsteps = "3"\n', "[run] steps must be an integer, got a string"),
        ('[tasks]\nfamily = "echo"\npath = "x"\n', "exactly one of path"),
        ('[tasks]\nfamily = "ech"\n', "family must be one of echo, arith"),
        ("[run]\nsteps = 3\n", "a [tasks] section is required"),
        ('[tasks]\nfamily = "echo"\n[async]\nmax_staleness = 0\nupdate_interval = 2\n', "raise max_staleness"),
        ('[tasks]\nfamily = "echo"\n[rollout]\ngroup_size = 1\n', "group_size must be >= 2"),
        ('[tasks]\nfamily = "echo"\n[train]\nlr = -1\n', "[train]: lr must be a finite number > 0"),
        ('[tasks]\nfamily = "echo"\n[train.loss]\nloss_type = "ppo"\n', "loss_type must be one of"),
        ('[tasks]\nfamily = "echo"\n[model]\ninference = "localhost:3000"\n', "http(s):// URL"),
        ("[tasks\n", "is not valid TOML"),
        ('[tasks]\nfamily = "echo"\n[rollout]\nhost_capacity = 0\n', "host_capacity must be >= 1"),
        (
            '[tasks]\nfamily = "echo"\n[rollout]\nhost_capacity = 2\ncapacity_file = "h.json"\n',
            "host_capacity or capacity_file, not both",
        ),
        ('[tasks]\nfamily = "echo"\n[rollout]\ncapacity_file = "nope.json"\n', "[rollout] capacity_file: cannot read"),
    ],
)
def test_config_errors_name_the_file_the_key_and_the_fix(tmp_path: Path, text: str, needle: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_run_config(path)
    assert needle in str(info.value)
    assert str(path) in str(info.value)


def test_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the config file"):
        load_run_config(tmp_path / "nope.toml")


def test_the_resolved_config_reads_back_unchanged(tmp_path: Path) -> None:
    config = load_run_config(REPO / "configs" / "tiny.toml")
    assert config.run.output_dir == str(Path.cwd() / "runs" / "tiny")  # relative to the working directory
    assert config.tasks.family == "echo" and config.train.loss.loss_type == "dapo"
    saved = save_resolved(config, tmp_path / "config.toml")
    assert load_run_config(saved) == config
    assert "max_staleness = 1" in saved.read_text() and "tis_cap" in saved.read_text()


def test_the_host_capacity_comes_from_a_contention_result_beside_the_config(tmp_path: Path) -> None:
    (tmp_path / "hostA.json").write_text(json.dumps(synthetic_result(2, capacity=2, slow=1.0)))
    path = _write(tmp_path, '[tasks]\nfamily = "echo"\n[rollout]\ncapacity_file = "hostA.json"\n')
    config = load_run_config(path)
    assert config.rollout.capacity_file == str(tmp_path / "hostA.json") and config.rollout.slots() == 3
    assert load_run_config(save_resolved(config, tmp_path / "saved.toml")) == config
    given = load_run_config(_write(tmp_path, '[tasks]\nfamily = "echo"\n[rollout]\nhost_capacity = 4\n'))
    assert given.rollout.slots() == 4
    assert load_run_config(_write(tmp_path, '[tasks]\nfamily = "echo"\n')).rollout.slots() is None


def _trajectory(group: str, index: int, reward: float | None, status: str = "completed") -> Trajectory:
    return Trajectory.from_dict(
        {
            "episode_id": f"{group}/{index}",
            "group_id": group,
            "task_id": "t",
            "sample_index": index,
            "agent": "llm",
            "status": status,
            "reward": reward,
            "ids": [1, 2, 3],
            "loss_mask": [0, 1, 1],
            "logprobs": [0.0, -0.5, -0.25],
            "weight_version": 3,
        }
    )


def test_infra_errors_are_never_trained_and_equal_reward_groups_are_counted() -> None:
    mixed = [_trajectory("a", 0, 1.0), _trajectory("a", 1, 0.0), _trajectory("a", 2, None, "infra_error")]
    flat = [_trajectory("b", 0, 1.0), _trajectory("b", 1, 1.0)]
    adapted = batch_from_groups([mixed, flat])
    assert adapted.episodes == 5 and adapted.infra_errors == 1 and adapted.untrainable == 0
    assert adapted.batch.zero_signal_groups == 1 and adapted.batch.groups == 2
    samples = adapted.batch.samples
    assert [s.episode_id for s in samples] == ["a/0", "a/1"]
    assert samples[0].advantage > 0 > samples[1].advantage
    assert samples[0].token_ids == (1, 2, 3) and samples[0].rollout_logprobs == (0.0, -0.5, -0.25)
    assert samples[0].weight_version == 3


def test_episodes_without_a_reward_or_model_tokens_are_left_out() -> None:
    no_reward = _trajectory("a", 0, None, "agent_error")
    group = [no_reward, _trajectory("a", 1, 1.0), _trajectory("a", 2, 0.0)]
    adapted = batch_from_groups([group])
    assert adapted.untrainable == 1 and adapted.infra_errors == 0 and len(adapted.batch.samples) == 2
