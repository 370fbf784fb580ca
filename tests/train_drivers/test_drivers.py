"""The sync and async drivers end to end: real sandboxes, the tiny embedded engine, the real trainer."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest

from sandrl.errors import ConfigError
from sandrl.inference.base import InferenceClient
from sandrl.rollout.agent import AgentResult, Budget
from sandrl.rollout.jsonl import read_jsonl
from sandrl.sandbox.base import Sandbox
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.tasks.task import Task
from sandrl.train.batch import Batch
from sandrl.train.command import run_training
from sandrl.train.trainer import Trainer

from .conftest import ParityAgent, run_config


def _metrics(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _position(group_id: str) -> int:
    return int(group_id.rsplit("#", 1)[1].split(".")[0])


@pytest.fixture
def step_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, object]]:
    """Every Trainer.step call: the driver mode and the function object that ran."""
    calls: list[tuple[str, object]] = []
    original = Trainer.step

    def spy(self: Trainer, batch: Any) -> Any:
        assert isinstance(batch, Batch)
        calls.append(("step", original))
        return original(self, batch)

    monkeypatch.setattr(Trainer, "step", spy)
    return calls


async def test_sync_run_pushes_weights_that_the_next_episodes_carry_then_resumes_and_replays(
    tmp_path: Path, provider: BwrapProvider, step_calls: list[tuple[str, object]], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "sync"
    # Groups of 8 at a gentle rate: the policy does not learn "always even" within the run, so
    # (short of a 1-in-16000 draw) each step has a group whose rewards differ and updates.
    tables: dict[str, dict[str, Any]] = {"rollout": {"group_size": 8}, "train": {"lr": 1e-3}}
    config = run_config(out, **tables)
    last = await run_training(config, mode="sync", provider=provider, agent=ParityAgent())
    lines = _metrics(out)
    assert [m["step"] for m in lines] == [1, 2, 3] and last["steps"] == 3
    assert len(step_calls) == 3
    assert all(m["train/updates"] >= 1 for m in lines), "parity rewards vary: every step should update"
    # Weight sync: the groups of step k were sampled by the version the trainer had after step k-1.
    version_before = {1: 0, 2: lines[0]["weight_version"], 3: lines[1]["weight_version"]}
    trajectories = read_jsonl(out / "rollouts.jsonl")
    assert len(trajectories) == 3 * 2 * 8
    for t in trajectories:
        step = _position(t.group_id) // 2 + 1
        assert t.weight_version == version_before[step], (t.group_id, t.weight_version)
    assert all(m["staleness_hist"] == {"0": 16} for m in lines)
    assert (out / "config.toml").is_file() and sorted(p.name for p in (out / "checkpoints").iterdir())

    # Resume: one more step continues from the checkpoint's data position and weights.
    more = run_config(out, run={"steps": 4}, **tables)
    await run_training(more, mode="sync", provider=provider, agent=ParityAgent())
    lines = _metrics(out)
    assert [m["step"] for m in lines] == [1, 2, 3, 4]
    new = {_position(t.group_id) for t in read_jsonl(out / "rollouts.jsonl")[3 * 16 :]}
    assert new == {6, 7}
    assert {t.weight_version for t in read_jsonl(out / "rollouts.jsonl")[3 * 16 :]} == {lines[2]["weight_version"]}

    # --load-rollouts: the same trajectories train a fresh run with no sandboxes and no inference.
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("--load-rollouts must not start sandboxes or an engine")

    monkeypatch.setattr(BwrapProvider, "create", refuse)
    monkeypatch.setattr("sandrl.inference.engine.Engine.load", refuse)
    replay = run_config(tmp_path / "replay", run={"steps": 10, "save_rollouts": False}, **tables)
    await run_training(replay, mode="async", load_rollouts=out / "rollouts.jsonl")
    replayed = _metrics(tmp_path / "replay")
    assert [m["step"] for m in replayed] == [1, 2, 3, 4]  # 8 groups in the file, 2 a step
    assert replayed[-1]["weight_version"] >= 4 and replayed[-1]["total_episodes"] == 64
    assert len(step_calls) == 4 + 4


async def test_async_run_bounds_staleness_and_uses_the_same_step(
    tmp_path: Path, provider: BwrapProvider, step_calls: list[tuple[str, object]]
) -> None:
    out = tmp_path / "async"
    config = run_config(out, run={"steps": 4}, **{"async": {"max_staleness": 1, "on_stale": "regenerate"}})
    await run_training(config, mode="async", provider=provider, agent=ParityAgent())
    lines = _metrics(out)
    assert [m["step"] for m in lines] == [1, 2, 3, 4] and {m["mode"] for m in lines} == {"async"}
    assert len(step_calls) == 4 and len({id(fn) for _, fn in step_calls}) == 1  # the one Trainer.step
    assert list(inspect.signature(Trainer.step).parameters) == ["self", "batch"]  # no mode to branch on
    for m in lines:
        assert all(int(k) <= 1 for k in m["staleness_hist"]), m["staleness_hist"]
        assert 0.0 <= m["buffer_fill"] <= 1.0 and m["trainer_idle_s"] >= 0 and m["rollout_idle_s"] >= 0
    assert lines[-1]["weight_version"] >= 1
    # Rollouts ran ahead of the trainer: some groups were sampled by older weights than the step's.
    print("async staleness", [m["staleness_hist"] for m in lines], "regenerated", lines[-1]["total_stale_regenerated"])


async def test_rollout_only_collects_without_training(tmp_path: Path, provider: BwrapProvider) -> None:
    out = tmp_path / "collect"
    await run_training(run_config(out, run={"steps": 1}), rollout_only=True, provider=provider, agent=ParityAgent())
    assert len(read_jsonl(out / "rollouts.jsonl")) == 8
    assert not (out / "checkpoints").exists()
    assert _metrics(out)[0]["weight_version"] == 0


class StampingAgent(ParityAgent):
    """The parity agent, after one command that prints when it started and ended (the host's clock)."""

    def __init__(self) -> None:
        super().__init__()
        self.intervals: list[tuple[float, float]] = []

    async def run(self, task: Task, sandbox: Sandbox, policy: InferenceClient | None, budget: Budget) -> AgentResult:
        result = await sandbox.exec("date +%s.%N; sleep 0.2; date +%s.%N", timeout_s=30)
        start, end = map(float, result.stdout.split())
        self.intervals.append((start, end))
        return await super().run(task, sandbox, policy, budget)


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda x: (x[0], x[1]))
    now = peak = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


@pytest.mark.parametrize(("capacity", "expect_one"), [(1, True), (None, False)])
async def test_the_host_capacity_queues_commands_beyond_it(
    tmp_path: Path, provider: BwrapProvider, capacity: int | None, expect_one: bool
) -> None:
    """8 episodes at once: with a host capacity of 1 their commands never overlap; without one they do."""
    out = tmp_path / "admitted"
    config = run_config(out, run={"steps": 1}, rollout={"host_capacity": capacity or False})
    agent = StampingAgent()
    await run_training(config, rollout_only=True, provider=provider, agent=agent)
    assert len(agent.intervals) == 8 and len(read_jsonl(out / "rollouts.jsonl")) == 8
    assert (most_at_once(agent.intervals) == 1) is expect_one
    assert ("host_capacity = 1" in (out / "config.toml").read_text()) is expect_one


async def test_bad_flags_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--mode must be one of sync, async"):
        await run_training(run_config(tmp_path), mode="fast")
    with pytest.raises(ConfigError, match="no such file"):
        await run_training(run_config(tmp_path), load_rollouts=tmp_path / "missing.jsonl")


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_the_llm_agent_with_the_tiny_model_runs_end_to_end(
    tmp_path: Path, provider: BwrapProvider, mode: str
) -> None:
    """The real agent: the random tiny model writes no bash block, so rewards are 0 and no group trains."""
    out = tmp_path / mode
    config = run_config(out, run={"steps": 2}, rollout={"group_size": 2, "max_new_tokens": 16})
    await run_training(config, mode=mode, provider=provider)
    lines = _metrics(out)
    assert [m["step"] for m in lines] == [1, 2]
    assert lines[-1]["total_episodes"] == 8 and lines[-1]["total_infra_errors"] == 0
    assert lines[-1]["total_zero_signal_groups"] + sum(m["groups_trained"] for m in lines) == 4
    assert all(t.agent == "llm" and t.ids for t in read_jsonl(out / "rollouts.jsonl"))


async def test_a_harness_agent_trains_through_the_gateway_with_its_segments(
    tmp_path: Path, provider: BwrapProvider
) -> None:
    """``[rollout] agent = "module:function"``: the gateway is started for the run, every episode's two
    segments reach the trainer, and groups with a reward signal train."""
    out = tmp_path / "harness"
    config = run_config(
        out,
        run={"steps": 2},
        rollout={"agent": "tests.train_drivers.harnesses:parity_harness", "max_turns": 2, "group_size": 4},
    )
    await run_training(config, mode="sync", provider=provider)
    lines = _metrics(out)
    assert [m["step"] for m in lines] == [1, 2] and lines[-1]["total_infra_errors"] == 0
    trajectories = list(read_jsonl(out / "rollouts.jsonl"))
    assert trajectories and all(t.agent == "tests.train_drivers.harnesses:parity_harness" for t in trajectories)
    assert all(len(t.segment_starts) == 2 and t.num_turns == 2 for t in trajectories)
    assert {t.reward for t in trajectories} == {0.0, 1.0}
    assert sum(m["groups_trained"] for m in lines) >= 1
