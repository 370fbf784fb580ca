"""``[train.loss]`` estimator, advantage and ``[train.loss.is]`` as a user's TOML gives them: read, saved, refused."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from sandrl.errors import ConfigError
from sandrl.train.loss_config import ImportanceConfig
from sandrl.train.losses import LossConfig
from sandrl.train.run_config import from_dict, load_run_config, save_resolved


def _load(tmp_path: Path, loss: str, overrides: tuple[str, ...] = ()) -> LossConfig:
    file = tmp_path / "run.toml"
    file.write_text(f'[tasks]\nfamily = "echo"\n\n{loss}')
    return load_run_config(file, overrides).train.loss


def test_estimator_advantage_and_the_is_table_are_read(tmp_path: Path) -> None:
    loss = _load(
        tmp_path,
        '[train.loss]\nestimator = "gspo"\nadvantage = "rloo"\nscale_rewards = "none"\nepsilon_low = 3e-4\n'
        '[train.loss.is]\nlevel = "geometric"\nmode = "mask"\nband = [0.5, 2]\n',
    )
    assert (loss.estimator, loss.advantage, loss.scale_rewards) == ("gspo", "rloo", "none")
    assert loss.importance == ImportanceConfig(level="geometric", mode="mask", band=(0.5, 2.0))
    assert loss.importance_sampling == loss.importance


def test_the_defaults_are_todays_loss(tmp_path: Path) -> None:
    loss = _load(tmp_path, "")
    assert (loss.estimator, loss.advantage, loss.importance) == ("ppo", "grpo", None)
    assert loss.importance_sampling == ImportanceConfig(level="token", mode="truncate", band=(0.0, 2.0))


def test_the_is_table_round_trips_through_the_saved_config(tmp_path: Path) -> None:
    config = from_dict(
        {
            "tasks": {"family": "echo"},
            "run": {"output_dir": str(tmp_path / "out")},
            "train": {"loss": {"estimator": "cispo", "is": {"level": "sequence", "band": [0.0, 5.0]}}},
        }
    )
    saved = save_resolved(config)
    assert "[train.loss.is]" in saved.read_text()
    assert load_run_config(saved).train == config.train


def test_set_reaches_the_is_table(tmp_path: Path) -> None:
    loss = _load(tmp_path, "", ("train.loss.tis_cap=false", "train.loss.estimator=gspo"))
    assert loss.importance_sampling is None
    loss = _load(
        tmp_path, "", ("train.loss.is.level=geometric", "train.loss.is.band=0.5,2", "train.loss.estimator=gspo")
    )
    assert loss.importance == ImportanceConfig(level="geometric", band=(0.5, 2.0))


@pytest.mark.parametrize(
    ("loss", "message"),
    [
        (
            '[train.loss]\nestimator = "gspo"\n',
            r'\[train.loss\]: estimator = "gspo" weighs whole sequences but importance sampling is per token '
            r'\(tis_cap = 2.0, the default\): set \[train.loss.is\] level = "geometric" \(or "sequence"\), '
            "or tis_cap = false",
        ),
        (
            '[train.loss]\nestimator = "gspo"\n[train.loss.is]\nmode = "mask"\nband = [0.5, 2.0]\n',
            r'estimator = "gspo" weighs whole sequences but importance sampling is per token: set',
        ),
        (
            "[train.loss.is]\nband = [2.0, 0.5]\n",
            r"\[train.loss.is\]: band's low \(2.0\) is above its high \(0.5\); write it \[low, high\]",
        ),
        ("[train.loss.is]\nband = [0.0, 0.0]\n", r"\[train.loss.is\]: band's high must be > 0"),
        ("[train.loss.is]\nband = [1.2, 2.0]\n", r"\[train.loss.is\]: band \[1.2, 2.0\] must hold 1"),
        ("[train.loss.is]\nband = 2.0\n", r"\[train.loss.is\] band must be a list"),
        ('[train.loss.is]\nlevel = "tokens"\n', r"\[train.loss.is\] level must be one of 'token', 'sequence'"),
        (
            '[train.loss.is]\nclip = "yes"\n',
            r"\[train.loss.is\]: unknown key\(s\) clip; valid keys are level, mode, band",
        ),
        (
            '[train.loss]\ntis_cap = false\n[train.loss.is]\nlevel = "token"\n',
            r"\[train.loss\]: tis_cap = false turns importance sampling off but \[train.loss.is\] turns it on",
        ),
        (
            '[train.loss]\ntis_cap = 3.0\n[train.loss.is]\nlevel = "sequence"\n',
            r'tis_cap = 3.0 means \[train.loss.is\] level = "token", mode = "truncate", band = \[0, 3.0\], '
            r"which the \[train.loss.is\] table contradicts: remove tis_cap",
        ),
        (
            '[train.loss]\nadvantage = "reinforce_pp_baseline"\nscale_rewards = "none"\n',
            r'advantage = "reinforce_pp_baseline" divides by the batch\'s standard deviation, which '
            r'scale_rewards = "none" contradicts',
        ),
        ('[train.loss]\nestimator = "grpo"\n', r"\[train.loss\] estimator must be one of 'ppo', 'gspo', 'cispo'"),
        ('[train.loss]\nadvantage = "ppo"\n', r"\[train.loss\] advantage must be one of 'grpo', 'rloo'"),
        ("[train.loss]\nimportance = false\n", r"unknown key\(s\) importance; valid keys are .*tis_cap, is, "),
    ],
)
def test_contradictions_are_refused_at_load_with_the_fix(tmp_path: Path, loss: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _load(tmp_path, loss)


def test_tis_cap_beside_a_table_that_says_the_same_is_accepted(tmp_path: Path) -> None:
    loss = _load(tmp_path, '[train.loss]\ntis_cap = 3.0\n[train.loss.is]\nlevel = "token"\nband = [0, 3]\n')
    assert loss.importance_sampling == ImportanceConfig(band=(0.0, 3.0))
    gspo = _load(tmp_path, '[train.loss]\nestimator = "gspo"\ntis_cap = false\n')
    assert gspo.importance_sampling is None


def test_every_toml_example_of_the_learning_signal_guide_loads() -> None:
    page = Path(__file__).resolve().parents[2] / "docs" / "guide" / "learning-signal.md"
    blocks = re.findall(r"```toml\n(.*?)```", page.read_text(), flags=re.DOTALL)
    assert len(blocks) >= 4
    for block in blocks:
        data = tomllib.loads(block)
        assert set(data) == {"train"}, block
        from_dict({"tasks": {"family": "echo"}, **data}, where="learning-signal.md")
