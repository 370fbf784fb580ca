"""Two embedded engines launched from a run's config (``[inference] launch = "embedded"``), sampled by real
LLM-agent episodes in real sandboxes: each episode's turns on one engine (the engines' own request logs
say so), an engine killed with SIGKILL mid-run restarted while the run goes on, with no infra error and
every turn what one engine alone would have sampled."""

from __future__ import annotations

import asyncio
import os
import re
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from sandrl.inference.base import InferenceClient, SamplingParams
from sandrl.inference.engine import Engine, EngineConfig
from sandrl.inference.fleet import affinity
from sandrl.inference.model import build_tiny_model, save_weights
from sandrl.inference.tokenizer import ByteTokenizer
from sandrl.rollout import Budget, EpisodeConfig, LLMAgent, LLMAgentConfig, RolloutRunner, RunnerConfig, Trajectory
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.tasks import Task, load_tasks
from sandrl.tasks.builtin.generated import generate_tasks

from ...support import REASON
from .embedded import embedded_fleet

pytestmark = [
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(REASON is not None, reason=REASON or ""),
]

GREEDY = SamplingParams(temperature=0, max_new_tokens=12)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fleet-run")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def policy(run_dir: Path) -> AsyncIterator[InferenceClient]:
    async with embedded_fleet(run_dir) as served:
        yield served


@pytest.fixture(scope="module")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BwrapProvider]:
    p = BwrapProvider(tmp_path_factory.mktemp("fleet-sandboxes"))
    yield p
    p._close_all_sync()


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> list[Task]:
    root = tmp_path_factory.mktemp("fleet-tasks")
    generate_tasks(root, "echo", 3, seed=0)
    loaded, problems = load_tasks(root)
    assert not problems
    return loaded


def runner(provider: BwrapProvider, policy: InferenceClient, *, group_size: int) -> RolloutRunner:
    agent = LLMAgent(ByteTokenizer(), LLMAgentConfig(sampling=GREEDY))
    config = RunnerConfig(group_size=group_size, concurrency=3, run_id="fleet", episode=EpisodeConfig(Budget(4)))
    return RolloutRunner(provider, agent, policy=policy, config=config)


def logs(run_dir: Path) -> list[Path]:
    return [run_dir / "out" / "engines" / f"engine-{i}.log" for i in range(2)]


def generates(log: Path) -> int:
    return log.read_text().count('"POST /generate HTTP/1.1" 200')


def engine_pid(log: Path) -> int:
    return int(re.findall(r"Started server process \[(\d+)\]", log.read_text())[-1])


async def until_serving(policy: InferenceClient) -> None:
    """Until the router has both engines again (a killed one restarts in seconds)."""
    async with asyncio.timeout(120):
        while True:
            fleet = await policy._http.get("/sandrl/fleet")  # type: ignore[attr-defined]
            if all(e["up"] for e in fleet["engines"]):
                return
            await asyncio.sleep(0.2)


async def test_an_episodes_turns_reach_one_engine_and_its_next_turn_the_other_once_it_died(
    policy: InferenceClient, provider: BwrapProvider, tasks: list[Task], run_dir: Path
) -> None:
    model, tokenizer = build_tiny_model()  # the served weights again, as the trainer would push them
    weights = save_weights(model, run_dir / "weights-v1", tokenizer)
    assert await policy.update_weights(str(weights), version=1) == 1  # to both engines
    before = [generates(log) for log in logs(run_dir)]
    (group,) = (await runner(provider, policy, group_size=1).run(tasks[:1])).groups
    (episode,) = group.trajectories
    assert episode.num_turns == 4 and episode.status == "truncated"
    assert {turn.weight_version for turn in episode.turns} == {1}
    served = [generates(log) - n for log, n in zip(logs(run_dir), before, strict=True)]
    assert sorted(served) == [0, 4]  # all four turns on one engine
    home = served.index(4)
    os.kill(engine_pid(logs(run_dir)[home]), signal.SIGKILL)
    with affinity.bound(episode.episode_id) as route:
        await policy.generate(episode.ids, GREEDY)  # the episode's next turn
    after = [generates(log) - n for log, n in zip(logs(run_dir), before, strict=True)]
    assert after[1 - home] == 1 and route.moves == 1
    await until_serving(policy)
    restarted = logs(run_dir)[home].read_text().split("--- sandrl: restarting (1) engine")[1]
    assert '"POST /update_weights_from_disk HTTP/1.1" 200' in restarted  # v1 again, before it served


async def test_an_engine_killed_mid_run_restarts_and_the_run_goes_on_token_exact(
    policy: InferenceClient, provider: BwrapProvider, tasks: list[Task], run_dir: Path
) -> None:
    await until_serving(policy)
    reference = Engine.load("tiny", EngineConfig(seed=0))
    try:
        alone = (await runner(provider, reference, group_size=2).run(tasks)).trajectories
    finally:
        reference.close()
    victim = logs(run_dir)[0]
    restarts = victim.read_text().count("--- sandrl: restarting")
    start = generates(victim)
    run = asyncio.ensure_future(runner(provider, policy, group_size=2).run(tasks))
    async with asyncio.timeout(60):
        while generates(victim) < start + 3:  # engine 0 is serving the run
            await asyncio.sleep(0.02)
    os.kill(engine_pid(victim), signal.SIGKILL)
    fleet = (await run).trajectories
    assert [t.status for t in fleet] == ["truncated"] * 6  # no infra error: every episode ran its 4 turns
    assert sum(t.engine_moves for t in fleet) >= 1
    for mine, theirs in zip(sorted(fleet, key=ids), sorted(alone, key=ids), strict=True):
        assert (mine.episode_id, mine.ids, mine.loss_mask) == (theirs.episode_id, theirs.ids, theirs.loss_mask)
        assert mine.logprobs == pytest.approx(theirs.logprobs, abs=1e-4)
        mine.check()
    await until_serving(policy)
    assert victim.read_text().count("--- sandrl: restarting") == restarts + 1


def ids(trajectory: Trajectory) -> str:
    return trajectory.episode_id
