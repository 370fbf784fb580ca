"""TrainConfig: defaults that work, contradictions refused, a [train] TOML table read with clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandrl.errors import ConfigError
from sandrl.train.config import TrainConfig
from sandrl.train.losses import LossConfig


def test_a_toml_table_with_a_nested_loss_table(tmp_path: Path) -> None:
    file = tmp_path / "run.toml"
    file.write_text(
        "[train]\nlr = 1e-4\nmicro_batch_tokens = 512\nmax_grad_norm = 0.5\n"
        '[train.loss]\nloss_type = "dapo"\nepsilon_high = 0.28\ntis_cap = 3\n'
    )
    cfg = TrainConfig.from_toml(file)
    assert (cfg.lr, cfg.micro_batch_tokens, cfg.max_grad_norm) == (1e-4, 512, 0.5)
    assert cfg.loss == LossConfig(loss_type="dapo", epsilon_high=0.28, tis_cap=3.0)


def test_a_file_without_the_table_gives_the_defaults(tmp_path: Path) -> None:
    file = tmp_path / "run.toml"
    file.write_text("[other]\nx = 1\n")
    assert TrainConfig.from_toml(file) == TrainConfig()


def test_false_switches_an_optional_setting_off(tmp_path: Path) -> None:
    file = tmp_path / "run.toml"
    file.write_text("[train]\nmax_grad_norm = false\n[train.loss]\ntis_cap = false\n")
    cfg = TrainConfig.from_toml(file)
    assert cfg.max_grad_norm is None and cfg.loss.tis_cap is None


def test_the_config_round_trips_through_a_plain_dict() -> None:
    cfg = TrainConfig(lr=3e-6, loss=LossConfig(loss_type="dr_grpo", scale_rewards="none", tis_cap=None))
    assert TrainConfig.from_mapping(cfg.to_dict()) == cfg


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"lr": "fast"}, r"\[train\] lr must be a number, got a string 'fast'"),
        ({"micro_batch_tokens": 10.5}, r"\[train\] micro_batch_tokens must be an integer"),
        ({"minibatches": True}, r"minibatches must be an integer, got a boolean"),
        ({"learning_rate": 1e-5}, r"unknown key\(s\) learning_rate; valid keys are lr, "),
        ({"lr": -1.0}, r"\[train\]: lr must be a finite number > 0"),
        ({"loss": {"loss_type": "ppo"}}, r"\[train.loss\] loss_type must be one of 'grpo', 'dr_grpo', 'dapo'"),
        ({"loss": {"epsilon_low": 2.0}}, r"\[train.loss\]: epsilon_low must be < 1"),
        ({"loss": {"beta_kl": 0.1}}, r"\[train.loss\]: unknown key\(s\) beta_kl"),
        ({"loss": 3}, r"\[train.loss\] must be a table of keys, got an integer"),
    ],
)
def test_bad_values_name_the_key_and_the_fix(table: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TrainConfig.from_mapping(table)


def test_unreadable_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the config file"):
        TrainConfig.from_toml(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[train\n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        TrainConfig.from_toml(bad)
