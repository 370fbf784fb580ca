"""RolloutRunner: GRPO groups, the concurrency limit, streaming, stable ids, JSONL, the summary."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from sandrl.inference.base import SamplingParams
from sandrl.inference.engine import Engine
from sandrl.inference.tokenizer import ByteTokenizer
from sandrl.rollout import (
    Budget,
    EpisodeConfig,
    LLMAgent,
    LLMAgentConfig,
    OracleAgent,
    ReplayAgent,
    RolloutRunner,
    RunnerConfig,
    ThinkTime,
    TrajectoryWriter,
    read_jsonl,
)
from sandrl.rollout.images import TaskImages
from sandrl.rollout.summary import print_summary
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.tasks import Task

from .conftest import RecordingProvider


async def test_groups_concurrency_ids_and_jsonl(tasks: list[Task], provider: BwrapProvider, tmp_path: Path) -> None:
    recording = RecordingProvider(provider)
    agent = ReplayAgent(["ls", "@solution"], ThinkTime(1, 5, 100.0))
    config = RunnerConfig(concurrency=3, group_size=2, run_id="run7")
    with TrajectoryWriter(tmp_path / "rollouts.jsonl") as writer:
        runner = RolloutRunner(recording, agent, config=config, image_for=TaskImages(provider), writer=writer)
        result = await runner.run(tasks, progress=True)
    assert recording.live_peak <= 3 and recording.live == 0
    assert [g.task_id for g in result.groups] == [t.id for t in tasks]
    for group in result.groups:
        assert group.group_id == f"run7/{group.task_id}#0" and group.complete
        assert [t.episode_id for t in group.trajectories] == [f"{group.group_id}/0", f"{group.group_id}/1"]
        assert [t.sample_index for t in group.trajectories] == [0, 1]
        assert group.rewards == [1.0, 1.0]
    assert result.summary["episodes"] == 12 and result.summary["pass_rate"] == 1.0
    assert result.summary["status"] == {"completed": 12, "truncated": 0, "agent_error": 0, "infra_error": 0}
    assert set(result.summary["phases_s"]) >= {"queue_s", "sandbox_create_s", "model_s", "command_s", "total_s"}
    # Queueing shows: 12 episodes through 3 slots.
    assert max(t.timings.queue_s for t in result.trajectories) > 0.01
    saved = read_jsonl(tmp_path / "rollouts.jsonl")
    assert sorted(saved, key=lambda t: t.episode_id) == sorted(result.trajectories, key=lambda t: t.episode_id)
    print_summary(result.summary)


async def test_finished_groups_stream_first(tasks: list[Task], provider: BwrapProvider) -> None:
    fast, slow = tasks[0], tasks[1]

    def commands(task: Task) -> list[str]:
        return ["true"] if task.id == fast.id else ["sleep 1.5"]

    runner = RolloutRunner(
        provider, ReplayAgent(commands, ThinkTime(0, 0, 1.0)), config=RunnerConfig(concurrency=8, group_size=2)
    )
    order = [group.task_id async for group in runner.stream([slow, fast])]
    assert order == [fast.id, slow.id]


async def test_same_task_twice_gets_two_groups(echo_task: Task, provider: BwrapProvider) -> None:
    runner = RolloutRunner(provider, OracleAgent(), config=RunnerConfig(run_id="r"))
    result = await runner.run([echo_task, echo_task])
    assert [g.group_id for g in result.groups] == [f"r/{echo_task.id}#0", f"r/{echo_task.id}#1"]


async def test_llm_group_round_trips_through_jsonl(
    echo_task: Task, provider: BwrapProvider, engine: Engine, tokenizer: ByteTokenizer, tmp_path: Path
) -> None:
    agent = LLMAgent(tokenizer, LLMAgentConfig(sampling=SamplingParams(max_new_tokens=16)))
    config = RunnerConfig(group_size=3, episode=EpisodeConfig(Budget(max_turns=2)))
    result = await RolloutRunner(provider, agent, policy=engine, config=config).run([echo_task])
    (group,) = result.groups
    assert len({tuple(t.ids) for t in group.trajectories}) == 3  # independent samples
    path = tmp_path / "llm.jsonl"
    with TrajectoryWriter(path) as writer:
        writer.write_all(group.trajectories)
    loaded = read_jsonl(path)
    assert loaded == group.trajectories
    for before, after in zip(group.trajectories, loaded, strict=True):
        assert after.logprobs == before.logprobs  # bit for bit
        assert after.to_dict() == before.to_dict()
        assert json.dumps(after.to_dict()) == json.dumps(before.to_dict())


def test_config_rejects_nonsense() -> None:
    from sandrl.errors import ConfigError

    for bad in ({"concurrency": 0}, {"group_size": 0}, {"max_attempts": 0}):
        with pytest.raises(ConfigError):
            RunnerConfig(**bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "bad",
    [
        {"concurrency": 0},
        {"group_size": 0},
        {"max_attempts": 0},
        {"host_capacity": 0},
        {"fill_idle_cores": 0.0},
        {"fork_groups": "yes"},
    ],
)
def test_the_runner_settings_are_checked_once_in_the_runner_config(bad: dict[str, object]) -> None:
    """``[rollout]`` and ``sandrl eval`` say what RunnerConfig says about a bad runner setting."""
    from sandrl.errors import ConfigError
    from sandrl.wiring.config import RolloutConfig
    from sandrl.wiring.evaluate import EvalConfig

    with pytest.raises(ConfigError) as runner:
        RunnerConfig(**bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as rollout:
        RolloutConfig(**bad)  # type: ignore[arg-type]
    assert rollout.value.message == runner.value.message
    [(key, value)] = bad.items()
    option = "samples" if key == "group_size" else key
    said = {  # sandrl eval's options: refused by RunnerConfig, in eval's own words (as before the one check)
        "samples": "--samples and --concurrency must be at least 1",
        "concurrency": "--samples and --concurrency must be at least 1",
        "host_capacity": f"--host-capacity must be at least 1 command at once, got {value}",
    }
    if option in said:
        with pytest.raises(ConfigError) as evaluated:
            EvalConfig("builtin", **{option: value})  # type: ignore[arg-type]
        assert evaluated.value.message == said[option]


async def test_stream_cancelled_by_the_consumer(tasks: list[Task], provider: BwrapProvider) -> None:
    recording = RecordingProvider(provider)
    agent = ReplayAgent(["true"], ThinkTime(0, 0, 1.0))
    slow = ReplayAgent(["sleep 30"], ThinkTime(0, 0, 1.0))

    def pick(task: Task) -> list[str]:
        return slow.commands_for(task) if task.id != tasks[0].id else agent.commands_for(task)

    runner = RolloutRunner(
        recording,
        ReplayAgent(pick, ThinkTime(0, 0, 1.0)),
        config=RunnerConfig(concurrency=4),
        image_for=TaskImages(provider),
    )
    stream = runner.stream(tasks[:3])
    first = await anext(stream)
    assert first.task_id == tasks[0].id
    await stream.aclose()  # the trainer has enough: the rest is cancelled and cleaned up
    await asyncio.sleep(0)
    assert recording.live == 0
