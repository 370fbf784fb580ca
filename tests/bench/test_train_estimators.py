"""``sandrl bench train --estimators``: each loss through the demo from one warm start, one JSON line; and a
run's off-policy numbers, which come from the trainer's own metrics lines."""

from __future__ import annotations

import dataclasses
import json
import math
import tempfile
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sandrl.cli import app
from sandrl.demo.estimators import QUICK, ROWS, options, pool, row_config, shared_config, summarize
from sandrl.demo.learn import DemoConfig, rl_config
from sandrl.errors import ConfigError
from sandrl.train.batch import Batch, TrainSample
from sandrl.train.config import TrainConfig, to_table
from sandrl.train.loss_config import ImportanceConfig, LossConfig

from ..support import needs_sandbox
from ..train.helpers import make_trainer, sample


def _finite(value: Any) -> bool:
    return isinstance(value, float) and math.isfinite(value) and value >= 0


@needs_sandbox
def test_quick_run_trains_each_row_from_one_warm_start_and_prints_one_json_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    r = CliRunner().invoke(app, ["bench", "train", "--estimators", "--quick", "--json"])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert len(lines) == 1, r.output
    result = json.loads(lines[0])
    assert result["bench"] == "train_estimators" and result["quick"] and result["out"] is None
    s, demo = result["settings"], QUICK.demo
    assert (s["rows"], s["seeds"], s["family"], s["mode"]) == (["dapo", "gspo"], [0], "lines", "async")
    assert (s["rl_steps"], s["heldout_tasks"], s["heldout_samples"]) == (demo.rl_steps, 2, 2)
    warm = result["warm_start"]
    assert warm["steps"] == demo.warm.steps and not warm["reused"], "made once, here"
    before = result["heldout_before"]
    assert before["episodes"] == 2 * 2 and before["infra_errors"] == 0
    assert before["pass_rate"] == before["passed"] / before["episodes"]
    batch = s["groups_per_step"] * s["group_size"]
    for name, row in result["rows"].items():
        assert row["loss"] == json.loads(json.dumps(to_table(ROWS[name].loss))), "the [train.loss] table"
        assert row["demo_default"] == (name == "dapo")
        (run,) = row["runs"]
        assert run["seed"] == 0 and run["steps"] == demo.rl_steps, name
        assert run["episodes"] >= demo.rl_steps * batch and run["infra_errors"] == 0, name
        after = run["heldout_after"]
        assert after["episodes"] == 4 and after["infra_errors"] == 0, name
        assert run["gain_points"] == pytest.approx((after["pass_rate"] - before["pass_rate"]) * 100, abs=0.01)
        gain = row["gain_points"]
        assert gain["mean"] == gain["min"] == gain["max"] == run["gain_points"] and gain["std"] is None
        # Every trained group's episodes counted by how stale they were, within the run's bound.
        stale = run["by_staleness"]
        assert sum(c["episodes"] for c in stale.values()) == demo.rl_steps * batch, (name, stale)
        assert set(stale) <= {"0", "1"} and sum(c["samples"] for c in stale.values()) == run["samples_trained"]
        trained = run["tokens_trained"] > 0
        for key in ("mismatch_kl", "mismatch_kl_max", "is_masked_frac", "is_truncated_frac"):
            assert _finite(run[key]) if trained else run[key] is None, (name, key, run[key])
        for cause in stale.values():
            assert _finite(cause["mismatch_kl"]) if cause["samples"] else cause["mismatch_kl"] is None
        assert 0 < run["rl_wall_s"] <= run["wall_s"] == row["wall_s"]
    assert result["rows"]["gspo"]["loss"]["is"]["level"] == "geometric"
    assert not list(tmp_path.glob("sandrl-bench-estimators-*")), "the quick bench leaves no run behind"


def _steps(trainer_loss: LossConfig) -> list[dict[str, Any]]:
    """Two real trainer steps as a driver's metrics lines: samples 0, 1 and 4 versions behind, their
    engine log-probs off the trainer's by 0, 0.3 and 1.5 nats a token (so some leave a [0.5, 2] band)."""
    trainer = make_trainer(TrainConfig(lr=1e-2, loss=trainer_loss))
    lines = []
    for step in (1, 2):
        version = trainer.version
        batch: list[TrainSample] = []
        for i in range(6 if step == 1 else 3):  # steps of other sizes: their weights matter
            s = sample("p" * (3 + i), "answer"[: 2 + i % 4] * step, advantage=(-1.0) ** i, reward=float(i % 2))
            batch.append(dataclasses.replace(s, weight_version=version - (0, 1, 4)[i % 3]))
        exact = trainer.logprobs(batch)
        batch = [
            dataclasses.replace(s, rollout_logprobs=tuple(lp + (0.0, 0.3, 1.5)[i % 3] for lp in exact[i]))
            for i, s in enumerate(batch)
        ]
        metrics = trainer.step(Batch.of(batch))
        hist: dict[str, int] = {}
        for s in batch:
            behind = str(version - s.weight_version)
            hist[behind] = hist.get(behind, 0) + 1
        lines.append(
            {
                "step": step,
                "reward_mean": 0.5,
                "samples_trained": len(batch),
                "total_episodes": 6 + 3 * (step - 1),
                "staleness_hist": hist,
                **{f"train/{k}": v for k, v in metrics.items()},
            }
        )
    return lines


def test_a_runs_off_policy_numbers_are_the_trainers_steps_weighted_as_said() -> None:
    lines = _steps(LossConfig(loss_type="dapo", importance=ImportanceConfig(mode="mask", band=(0.5, 2.0))))
    got = summarize(lines)
    tokens = [m["train/tokens"] for m in lines]
    assert got["steps"] == 2 and got["samples_trained"] == 9 and got["tokens_trained"] == sum(tokens)
    for key in ("mismatch_kl", "is_masked_frac"):  # token-weighted over the steps
        expected = sum(m[f"train/{key}"] * t for m, t in zip(lines, tokens, strict=True)) / sum(tokens)
        assert got[key] == pytest.approx(expected, rel=1e-5), key
    assert got["mismatch_kl"] > 0 and 0 < got["is_masked_frac"] < 1
    assert got["mismatch_kl_max"] == pytest.approx(max(m["train/mismatch_kl"] for m in lines), rel=1e-5)
    stale = got["by_staleness"]
    assert list(stale) == ["0", "1", "3+"], "four versions behind counts as 3+, as the trainer names it"
    assert [stale[k]["episodes"] for k in stale] == [3, 3, 3] and [stale[k]["samples"] for k in stale] == [3, 3, 3]
    # Samples the engine and the trainer agree on: no mismatch, nothing masked; 1.5 nats off: all masked.
    assert stale["0"]["mismatch_kl"] == pytest.approx(0.0, abs=1e-6) and stale["0"]["is_masked_frac"] == 0
    assert stale["3+"]["is_masked_frac"] == pytest.approx(1.0) and stale["1"]["is_masked_frac"] == 0
    k3 = math.exp(-1.5) + 1.5 - 1  # exp(d) - d - 1 with d = trainer - engine = -1.5
    assert stale["3+"]["mismatch_kl"] == pytest.approx(k3, rel=1e-4)
    assert stale["1"]["mismatch_kl"] == pytest.approx(math.exp(-0.3) + 0.3 - 1, rel=1e-4)
    # Two seeds of the same run pool to the same numbers; the gain's spread is over the seeds.
    runs = [
        {**got, "seed": k, "gain_points": g, "heldout_after": {"pass_rate": p}, "wall_s": 1.0}
        for k, g, p in ((0, 10.0, 0.5), (1, 20.0, 0.6))
    ]
    pooled = pool(runs)
    assert pooled["gain_points"] == {"mean": 15.0, "min": 10.0, "max": 20.0, "std": pytest.approx(7.07, abs=0.01)}
    assert pooled["mismatch_kl"] == pytest.approx(got["mismatch_kl"], rel=1e-5)
    assert pooled["by_staleness"]["3+"] == {**stale["3+"], "episodes": 6, "samples": 6} | {
        k: pytest.approx(v) for k, v in stale["3+"].items() if k not in ("episodes", "samples")
    }
    assert pooled["wall_s"] == 2.0


def test_a_run_that_trained_nothing_reports_no_mismatch_rather_than_zero() -> None:
    line = {"step": 1, "reward_mean": 0.0, "samples_trained": 0, "staleness_hist": {"0": 4}, "train/tokens": 0.0}
    got = summarize([{**line, "train/mismatch_kl": 0.0, "train/is_masked_frac": 0.0}])
    assert got["mismatch_kl"] is None and got["mismatch_kl_max"] is None and got["is_masked_frac"] is None
    assert got["by_staleness"] == {
        "0": {
            "episodes": 4,
            "samples": 0,
            "mismatch_kl": None,
            "is_masked_frac": None,
            "is_truncated_frac": None,
            "clip_frac": None,
        }
    }


def test_every_row_shares_the_demos_run_but_its_loss_seed_and_directory(tmp_path: Path) -> None:
    demo = DemoConfig(out=tmp_path)
    shared = shared_config(demo)
    assert shared.output_dir == tmp_path / "warm" and shared.warm_start.enabled
    assert dataclasses.replace(shared, run=rl_config(demo).run) == rl_config(demo), "the demo's run, elsewhere"
    assert ROWS["dapo"].loss == rl_config(demo).train.loss, "the first row is the demo's loss today"
    for name, row in ROWS.items():
        config = row_config(shared, row.loss, 2, tmp_path / name)
        assert config.train.loss == row.loss and config.rollout.scale_rewards == row.loss.scale_rewards
        assert (config.run.seed, config.output_dir, config.warm_start.enabled) == (2, tmp_path / name, False)
        assert config.tasks == shared.tasks and config.async_ == shared.async_ and config.model == shared.model
        assert dataclasses.replace(config.train, loss=shared.train.loss) == shared.train


def test_bad_rows_and_seeds_and_flags_of_other_benches_are_refused() -> None:
    assert options(seeds=2, rows=["rloo"]).seeds == (0, 1) and options().rows == (
        "dapo",
        "gspo",
        "rloo",
        "reinforce_pp",
    )
    with pytest.raises(ConfigError, match="--rows takes names from dapo, gspo, rloo, reinforce_pp, cispo, icepop"):
        options(rows=["ppo"])
    with pytest.raises(ConfigError, match="names a row twice"):
        options(rows=["dapo", "dapo"])
    with pytest.raises(ConfigError, match=r"--seeds .* at least 1"):
        options(seeds=0)
    cases = {
        ("--estimators", "--steps", "3"): "--estimators takes only --quick, --seeds, --rows, --out and --json; "
        "--steps belongs to the async vs sync bench",
        ("--scale", "--rows", "dapo"): "--scale takes only --quick and --json; --rows belongs to --estimators",
        (
            "--seeds",
            "2",
        ): "the async vs sync bench takes only its own options; --seeds belongs to --estimators",
        ("--scale", "--estimators"): "--scale and --estimators are two benchmarks",
        ("--estimators", "--rows", "dapo,ppo"): "--rows takes names from",
    }
    for args, message in cases.items():
        r = CliRunner().invoke(app, ["bench", "train", *args])
        assert isinstance(r.exception, ConfigError), (args, r.output)
        assert message in str(r.exception), (args, str(r.exception))
