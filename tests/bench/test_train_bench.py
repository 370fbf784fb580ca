"""``sandrl bench train``: both drivers end to end on the same budget, one JSON line (its shape, not its speed).

The command runs by its entry point in this process (:func:`tests.entry_point.run_sandrl`)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from sandrl.bench.train import options
from sandrl.rollout.agents.scripted import CommandTimes

from ..entry_point import run_sandrl
from ..support import needs_sandbox


@needs_sandbox
def test_quick_run_trains_both_modes_the_same_budget_and_prints_one_json_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # TMPDIR, read once by a process
    env = {"TMPDIR": str(tmp_path)}
    r = run_sandrl(
        ["bench", "train", "--quick", "--json"], cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys, env=env
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 1, r.stdout
    result = json.loads(lines[0])
    assert result["bench"] == "train"
    for key in ("sync_episodes_per_hour", "async_episodes_per_hour", "ratio", "target_ratio", "met", "settings"):
        assert key in result, key
    settings = result["settings"]
    assert settings["concurrency"] == settings["groups_per_step"] * settings["group_size"]
    assert settings["command_times"]["dist"] == "lognormal"
    budget = settings["steps"] * settings["groups_per_step"] * settings["group_size"]
    for mode in ("sync", "async"):
        side = result[mode]
        assert side["steps"] == settings["steps"], mode
        assert side["episodes_trained"] == budget, mode
        assert side["episodes_run"] >= budget and side["infra_errors"] == 0, mode
        assert side["episodes_per_hour"] > 0 and side["command_s"]["max"] >= side["command_s"]["p50"] > 0
    assert result["sync"]["staleness_hist"] == {"0": budget}, "sync trains on the weights that sampled"
    assert result["sync"]["stale_dropped"] == result["sync"]["stale_regenerated"] == 0
    assert all(int(k) <= settings["max_staleness"] for k in result["async"]["staleness_hist"])
    assert result["ratio"] == pytest.approx(result["async_episodes_per_hour"] / result["sync_episodes_per_hour"], 1e-2)
    assert not list(tmp_path.glob("sandrl-bench-train-*")), "the bench leaves no run directory behind"


def test_command_times_are_seeded_per_key_and_long_tailed() -> None:
    times = CommandTimes(median_s=1.0, sigma=1.2, cap_s=50.0)
    assert times.draw("t/0") == times.draw("t/0") != times.draw("t/1")
    draws = sorted(times.draw(f"t/{k}") for k in range(2000))
    assert 0.9 < draws[1000] < 1.1  # the median
    assert draws[-20] > 10 * draws[1000]  # the slowest 1% take over 10x the median
    assert CommandTimes(median_s=1.0, sigma=3.0, cap_s=5.0).draw("x") <= 5.0


def test_options_are_checked_before_anything_starts() -> None:
    from sandrl.errors import ConfigError

    with pytest.raises(ConfigError, match="on_stale"):
        options(on_stale="sometimes")
    with pytest.raises(ConfigError, match="sigma"):
        options(sigma=-1.0)
    assert options(quick=True, steps=3).steps == 3 and options().times.sigma == 1.2
