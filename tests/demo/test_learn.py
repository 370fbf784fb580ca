"""The learning demo end to end at toy size: every phase runs for real and the numbers it reports add up."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sandrl.cli import app
from sandrl.demo.learn import DemoConfig, run, terminal_curve
from sandrl.errors import ConfigError
from sandrl.inference.tiny_config import TinyModelConfig
from sandrl.train.warmstart import WarmStartConfig

from ..support import needs_sandbox

TOY = DemoConfig(
    train_tasks=8,
    warm_tasks=8,
    heldout_tasks=3,
    heldout_samples=2,
    warm=WarmStartConfig(
        steps=6,
        batch_size=4,
        tiny=TinyModelConfig(
            hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64, max_position_embeddings=384
        ),
    ),
    rl_steps=2,
    groups_per_step=2,
    rollout=replace(DemoConfig().rollout, group_size=2, concurrency=4, max_new_tokens=24),
)


@needs_sandbox
async def test_the_demo_runs_every_phase_and_writes_its_numbers(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    summary = await run(replace(TOY, out=out))
    saved = json.loads((out / "demo.json").read_text())
    assert saved["improvement_points"] == summary["improvement_points"]
    for phase in ("heldout_before", "heldout_after"):
        result = saved[phase]
        assert result["episodes"] == 3 * 2 and result["infra_errors"] == 0
        assert result["pass_rate"] == result["passed"] / result["episodes"]
    label = {"heldout_before": "before", "heldout_after": "after"}
    for phase, name in label.items():
        lines = (out / f"heldout-{name}.jsonl").read_text().splitlines()
        assert len(lines) == saved[phase]["episodes"]
    assert saved["rl"]["steps"] == 2 and saved["rl"]["mode"] == "async"
    assert saved["warmstart"]["steps"] == 6
    assert (out / "reward.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "rl" / "config.toml").is_file()


def test_the_terminal_curve_draws_one_column_per_step_and_the_scale() -> None:
    chart = terminal_curve([0.0, 0.5, 1.0], height=4).splitlines()
    assert chart[0].startswith("1.00 |") and chart[0].endswith("  █")
    assert chart[3] == "     | ██"  # 0.0 draws nothing
    assert terminal_curve([]) == "(no steps)"
    assert len(terminal_curve([0.5] * 500, width=60).splitlines()[0]) == len("1.00 |") + 60


def test_bad_demo_settings_say_which_and_why() -> None:
    with pytest.raises(ConfigError, match="rl_steps"):
        DemoConfig(rl_steps=0)
    with pytest.raises(ConfigError, match="group_size"):
        DemoConfig(rollout=replace(DemoConfig().rollout, group_size=1))
    with pytest.raises(ConfigError, match="no task family 'poems'; choose one of echo, "):
        DemoConfig(family="poems")
    result = CliRunner().invoke(app, ["demo", "--rl-steps", "0"])
    assert result.exit_code != 0
    assert isinstance(result.exception, ConfigError)
