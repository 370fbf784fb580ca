"""The episode-level run: token emulation and breakdown by hand, then a tiny real run, reported and compared."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from sandrl.bench import episodes, report
from sandrl.bench.breakdown import EpisodeBreakdown
from sandrl.bench.episodes import EpisodesConfig
from sandrl.errors import ConfigError
from sandrl.result_file import load_result
from sandrl.rollout.trajectory import Timings, Trajectory, Turn
from sandrl.sandbox.bwrap import BwrapProvider

from ..entry_point import run_sandrl
from ..support import needs_sandbox
from .conftest import synthetic_result


def test_emulated_tokens_grow_the_context_turn_by_turn() -> None:
    turns = [Turn(0, "ls", model_s=2.0, sandbox_wait_s=1.0), Turn(1, "make", model_s=1.0, sandbox_wait_s=3.0)]
    dicts = episodes.emulated_turns(turns, prompt_tokens=1000, tokens_per_s=50.0, observation_tokens=200)
    assert [(d["context_tokens"], d["output_end"] - d["output_start"]) for d in dicts] == [(1000, 100), (1300, 50)]
    task = episodes.builtin_tasks(["fix-flatten-recursion"])[0]
    trajectory = Trajectory(
        episode_id="e",
        group_id="g",
        task_id=task.id,
        sample_index=0,
        agent="replay",
        status="completed",
        turns=turns,
        timings=Timings(sandbox_create_s=0.1, model_s=3.0, sandbox_wait_s=4.0, verifier_s=0.5, total_s=8.0),
    )
    cfg = EpisodesConfig(prompt_tokens=1000, tokens_per_s=50.0, observation_tokens=200)
    b = episodes.breakdown(trajectory, task, cfg)
    assert (b.total_s, b.model_s, b.commands_s, b.verifier_s, b.sandbox_create_s) == (8.0, 3.0, 4.0, 0.5, 0.1)
    ctx = 1000 + len(task.instruction) // 4
    assert b.kv is not None
    assert b.kv.decoding_token_s == pytest.approx(2.0 * (ctx + 50) + 1.0 * (ctx + 300 + 25))
    assert b.kv.idle_token_s == pytest.approx(1.0 * (ctx + 100) + 3.0 * (ctx + 350))


def test_the_replay_agent_has_the_fixed_model_time() -> None:
    agent = episodes.replay_agent(1.5, 40.0)
    assert agent.think.min_tokens == agent.think.max_tokens == 60 and agent.think.tokens_per_s == 40.0
    assert agent.commands_for(episodes.builtin_tasks(["fix-flatten-recursion"])[0])[3] == "@solution"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"episodes": 0}, "--episodes"),
        ({"background": -1}, "--background"),
        ({"model_s": -1.0}, "--model-s"),
        ({"tokens_per_s": 0.0}, "--tokens-per-s"),
        ({"concurrency": 0}, "--concurrency"),
        ({"tasks": ()}, "--tasks"),
    ],
)
def test_bad_settings_are_config_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        EpisodesConfig(**kwargs)


def test_unknown_tasks_are_named() -> None:
    with pytest.raises(ConfigError, match="no built-in task named nope"):
        episodes.builtin_tasks(["nope", "fix-flatten-recursion"])
    assert len(episodes.builtin_tasks(["all"])) >= len(episodes.DEFAULT_TASKS)
    assert {t.id for t in episodes.builtin_tasks(list(episodes.DEFAULT_TASKS))} == set(episodes.DEFAULT_TASKS)


def test_cli_bad_input_is_one_clear_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """By the command's entry point in this process (:func:`tests.entry_point.run_sandrl`)."""
    r = run_sandrl(["bench", "episodes", "--tasks", "nope"], cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "no built-in task named nope" in r.stderr
    r = run_sandrl(
        ["bench", "admission", "--capacity", "nowhere.json"], cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr and "--capacity takes a whole number" in r.stderr


@needs_sandbox
async def test_a_small_run_reports_and_compares(provider: BwrapProvider, tmp_path: Path) -> None:
    """Two built-in tasks under one background task: every phase there, verified; report and compare read it."""
    config = EpisodesConfig(
        quick=True,
        episodes=2,
        tasks=("fix-flatten-recursion", "c-multi-file-makefile"),
        background=1,
        model_s=0.1,
        concurrency=2,
        background_workloads=("sort_uniq",),
        settle_s=0.0,
        cores=1.0 if len(os.sched_getaffinity(0)) >= 2 else None,
    )
    console = Console(file=io.StringIO(), width=200)
    result = await episodes.run(config, provider=provider, console=console)
    assert "mean episode" in console.file.getvalue()  # type: ignore[attr-defined]
    path = tmp_path / "episodes.json"
    path.write_text(json.dumps(result) + "\n")
    loaded = load_result(path)
    assert loaded["bench"] == "episodes" and loaded["host"]["sandbox_backend"] == "bwrap"
    eps = loaded["episodes"]
    assert eps["n"] == 2 and eps["pass_rate"] == 1.0 and eps["status"]["completed"] == 2
    assert sorted(eps["episode_tasks"]) == ["c-multi-file-makefile", "fix-flatten-recursion"]
    assert eps["load"] == {"background": 1, "per_core": loaded["background"]["per_core"], "concurrency": 2}
    assert loaded["background"]["commands"] > 0 and not loaded["background"]["errors"]
    for b in map(EpisodeBreakdown.from_dict, eps["per_episode"]):
        assert b.model_s == pytest.approx(0.5, abs=0.1)  # five turns of 0.1 s
        assert b.commands_s > 0 and b.verifier_s > 0 and b.sandbox_create_s > 0
        assert b.kv is not None and 0 < b.kv.idle_fraction < 1
    assert [p["k"] for p in loaded["projection"]["points"]] == [1, 2, 4, 8, 16, 32]
    other = tmp_path / "contention.json"
    other.write_text(json.dumps(synthetic_result(2, capacity=1, slow=1.0)))
    _, compared = report.compare_files(other, path)
    rows = {r["measure"]: r for r in compared["rows"]}
    assert rows["episode s"]["b"] == eps["mean"]["total_s"] and rows["capacity (background tasks)"]["b"] is None
    assert "projection k=8: episode s" in rows
    html = report.render_html(report.load_labelled([path, other]))
    assert 'id="plot-breakdown"' in html and 'id="plot-projection"' in html
