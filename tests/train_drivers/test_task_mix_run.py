"""A run on [[tasks.sources]]: real sandboxes, the tiny engine and trainer, two generated families mixed 3:1."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from sandrl.rollout.jsonl import read_jsonl
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.train.command import run_training
from sandrl.train.run_config import RunConfig, from_dict
from sandrl.wiring import task_mix

from .conftest import ParityAgent, run_config

SOURCES = [{"family": "echo", "count": 8, "weight": 3}, {"family": "arith", "count": 4, "weight": 1}]


def _position(group_id: str) -> int:
    return int(group_id.rsplit("#", 1)[1].split(".")[0])


def _mixed(out: Path, steps: int, sources: list[dict[str, Any]] = SOURCES, groups: int = 4) -> RunConfig:
    """The drivers' small run (:func:`run_config`) on ``sources`` instead of its one family."""
    data = run_config(out, run={"steps": steps, "groups_per_step": groups}, rollout={"group_size": 2}).to_dict()
    data["tasks"] = {"sources": sources}
    return from_dict(data)


async def test_a_mixed_run_draws_each_position_from_the_mix_reports_each_source_and_resumes_on_it(
    tmp_path: Path, provider: BwrapProvider
) -> None:
    out = tmp_path / "mixed"
    config = _mixed(out, 2)
    last = await run_training(config, mode="sync", provider=provider, agent=ParityAgent())
    mix = task_mix(config.tasks, tmp_path / "check", config.run.seed)
    episodes = read_jsonl(out / "rollouts.jsonl")
    assert {_position(t.group_id) for t in episodes} == set(range(8))
    for t in episodes:
        assert t.task_id == mix.task_at(_position(t.group_id)).id
        assert t.task_set == mix.source_at(_position(t.group_id)).name  # family sources: tasks/<name>/
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for step, line in enumerate(lines, start=1):
        for name in ("echo", "arith"):
            mine = [t for t in episodes if _position(t.group_id) // 4 == step - 1 and t.task_set == name]
            assert line[f"source/{name}/episodes"] == len(mine)
            if mine:
                assert line[f"source/{name}/reward_mean"] == sum(t.reward or 0.0 for t in mine) / len(mine)
                assert line[f"source/{name}/pass_rate"] == sum(bool(t.passed) for t in mine) / len(mine)
    drawn = [mix.source_at(p).name for p in range(8)]
    assert "arith" in drawn[:4]  # each step's numbers of both sources are checked above
    # The run's result (its last line) carries the mix as realised, beside the weights asked for.
    assert last["source/echo/share"] == drawn.count("echo") / 8 and last["source/echo/weight"] == 0.75
    assert last["source/echo/groups_total"] + last["source/arith/groups_total"] == 8

    # Resumed for one more step: the next four positions, each the mix's task, with the whole run's shares.
    more = _mixed(out, 3)
    last = await run_training(more, mode="sync", provider=provider, agent=ParityAgent())
    new = read_jsonl(out / "rollouts.jsonl")[len(episodes) :]
    assert {_position(t.group_id) for t in new} == set(range(8, 12))
    assert all(t.task_id == mix.task_at(_position(t.group_id)).id for t in new)
    assert last["source/echo/share"] == [mix.source_at(p).name for p in range(12)].count("echo") / 12


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_run_whose_sources_all_run_out_ends_there_and_says_so(
    tmp_path: Path, provider: BwrapProvider, mode: str
) -> None:
    """4 groups in all, 3 a step: the second step has the one left (the async driver waited for more, forever)."""
    out = tmp_path / "ends"
    said = io.StringIO()
    sources = [{"family": "echo", "count": 2, "epochs": 1}, {"family": "arith", "count": 1, "epochs": 2, "name": "sum"}]
    config = _mixed(out, 10, sources, groups=3)
    console = Console(file=said, width=400)
    run = run_training(config, mode=mode, rollout_only=True, provider=provider, agent=ParityAgent(), console=console)
    last = await asyncio.wait_for(run, 120)
    assert last["steps"] == 2 and len(read_jsonl(out / "rollouts.jsonl")) == 4 * 2
    assert last["source/sum/groups_total"] == 2 and last["source/sum/ran_out"] == 1.0
    assert last["source/echo/groups_total"] == 2 and last["source/sum/share"] == 0.5
    text = said.getvalue()
    assert text.count("ran out:") == 2 and "source 'sum' ran out: each of its 1 tasks was drawn 2 time(s)" in text
    assert text.count("every source of [[tasks.sources]] has run out, after 4 groups") == 1
