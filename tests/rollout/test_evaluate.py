"""``sandrl eval`` and ``sandrl bench rollout`` as functions, end to end on real sandboxes."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from sandrl.bench.rollout import run as bench_rollout
from sandrl.errors import ConfigError
from sandrl.rollout import read_jsonl
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.wiring.evaluate import EvalConfig, evaluate, nothing_ran, result_line


async def test_eval_oracle_saves_rollouts(task_root: Path, provider: BwrapProvider, tmp_path: Path) -> None:
    config = EvalConfig(str(task_root), agent="oracle", samples=2, out=tmp_path / "out.jsonl", run_id="ev")
    result = await evaluate(config, provider=provider, progress=False, console=Console(file=io.StringIO()))
    line = result_line(config, result)
    assert line["pass_rate"] == 1.0 and line["episodes"] == 12 and line["status"]["completed"] == 12
    saved = {t.episode_id: t for t in read_jsonl(tmp_path / "out.jsonl")}
    assert saved == {t.episode_id: t for t in result.trajectories}


async def test_eval_says_why_each_failed_episode_failed(task_root: Path, provider: BwrapProvider) -> None:
    config = EvalConfig(str(task_root / "echo-0-0000"), agent="null")
    console = Console(file=io.StringIO(), width=300)
    result = await evaluate(config, provider=provider, progress=False, console=console)
    assert nothing_ran(result) is None  # it ran, and failed: a reward 0, not a broken run
    printed = console.file.getvalue()  # type: ignore[attr-defined]
    (line,) = [line for line in printed.splitlines() if line.startswith("  x")]
    # How many episodes, on which task, and the verifier's exit code with what it said last.
    assert line.startswith("  x1 (1 task: echo-0-0000): verifier exit ")
    assert "|" in line or "printed nothing" in line


async def test_eval_with_no_episode_able_to_run_says_why(tmp_path: Path, provider: BwrapProvider) -> None:
    task = tmp_path / "unbuildable"
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "task.toml").write_text("[environment]\nbuild_timeout_sec = 60\n")
    (task / "instruction.md").write_text("Do nothing.\n")
    (task / "environment" / "Dockerfile").write_text("FROM host\nRUN echo broken step >&2; exit 3\n")
    (task / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    config = EvalConfig(str(task), agent="oracle", samples=2, max_attempts=1)
    console = Console(file=io.StringIO(), width=300)
    result = await evaluate(config, provider=provider, progress=False, console=console)
    why = nothing_ran(result)
    assert why is not None and why.startswith("no episode could run: all 2 ended without a reward (image_build_failed")
    assert "exit" in why  # the build step's failure, as the builder reported it
    assert "x2 (1 task: unbuildable): infra error in image" in console.file.getvalue()  # type: ignore[attr-defined]


async def test_eval_llm_embedded(task_root: Path, provider: BwrapProvider) -> None:
    config = EvalConfig(
        str(task_root / "echo-0-0000"), agent="llm", inference="embedded", max_turns=2, max_new_tokens=16
    )
    result = await evaluate(config, provider=provider, progress=False, console=Console(file=io.StringIO()))
    (t,) = result.trajectories
    assert t.status == "truncated" and t.reward == 0.0 and t.num_turns == 2 and any(t.loss_mask)


async def test_eval_seed_seeds_the_embedded_engines_sampling(task_root: Path, provider: BwrapProvider) -> None:
    async def replies(seed: int) -> list[int]:
        config = EvalConfig(
            str(task_root / "echo-0-0000"),
            agent="llm",
            inference="embedded",
            max_turns=1,
            max_new_tokens=24,
            concurrency=1,
            seed=seed,
        )
        result = await evaluate(config, provider=provider, progress=False, console=Console(file=io.StringIO()))
        (t,) = result.trajectories
        return t.ids[t.prompt_len :]

    first = await replies(1)
    assert first == await replies(1)  # the same seed, the same sampled reply
    assert first != await replies(2)


async def test_eval_admits_commands_up_to_the_host_capacity(task_root: Path, provider: BwrapProvider) -> None:
    config = EvalConfig(str(task_root), agent="oracle", samples=2, concurrency=6, host_capacity=1)
    console = Console(file=io.StringIO(), width=200)
    result = await evaluate(config, provider=provider, progress=False, console=console)
    assert result_line(config, result)["pass_rate"] == 1.0
    admission = result.summary["admission"]
    assert admission["slots"] == 1 and admission["peak_running"] == 1 and admission["queued"] > 0
    assert "admission: 1 commands at once" in console.file.getvalue()  # type: ignore[attr-defined]


def test_eval_config_is_checked() -> None:
    with pytest.raises(ConfigError, match="needs --inference"):
        EvalConfig("builtin", agent="llm")
    with pytest.raises(ConfigError, match="--agent must be"):
        EvalConfig("builtin", agent="gpt")  # type: ignore[arg-type]
    # The runner's settings are checked by RunnerConfig; the message is sandrl eval's, naming its options.
    with pytest.raises(ConfigError, match=r"^--host-capacity must be at least 1 command at once, got 0$"):
        EvalConfig("builtin", host_capacity=0)
    with pytest.raises(ConfigError, match=r"^--samples and --concurrency must be at least 1$"):
        EvalConfig("builtin", samples=0)
    with pytest.raises(ConfigError, match=r"^--samples and --concurrency must be at least 1$"):
        EvalConfig("builtin", concurrency=0)


async def test_bench_rollout_small() -> None:
    result = await bench_rollout(
        episodes=8, concurrency=8, think_s=(0.05, 0.1), progress=False, console=Console(file=io.StringIO())
    )
    assert result["infra_errors"] == 0 and result["pass_rate"] == 1.0
    assert result["status"]["completed"] == 8
    assert result["overhead_share"] is not None and result["overhead_share"] < 0.05
    assert set(result["met"]) == {"zero_infra_errors", "overhead_under_1pct"}
