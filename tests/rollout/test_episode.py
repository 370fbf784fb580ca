"""run_episode: real tasks through the real verifier, infra errors that are not reward 0, cleanup on cancel."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

import pytest

from sandrl.errors import CapacityExhaustedError, SandboxCreateError
from sandrl.inference.base import Generation, InferenceClient, SamplingParams
from sandrl.inference.engine import Engine
from sandrl.inference.server import BackgroundServer, create_app
from sandrl.inference.sglang import SGLangClient
from sandrl.inference.tokenizer import ByteTokenizer
from sandrl.inference.transport import HTTPConfig
from sandrl.rollout import (
    AgentResult,
    Budget,
    EpisodeConfig,
    LLMAgent,
    LLMAgentConfig,
    NullAgent,
    OracleAgent,
    ReplayAgent,
    RolloutRunner,
    RunnerConfig,
    ThinkTime,
    run_episode,
)
from sandrl.rollout.images import TaskImages
from sandrl.sandbox.base import Sandbox
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.tasks import Task

from .conftest import RecordingProvider


@pytest.mark.parametrize("agent", [OracleAgent(), NullAgent()], ids=["oracle", "null"])
async def test_oracle_scores_1_and_null_0(
    agent: OracleAgent | NullAgent, tasks: list[Task], builtin_tasks: list[Task], provider: BwrapProvider
) -> None:
    images = TaskImages(provider)
    chosen = [next(t for t in tasks if t.id.startswith(family)) for family in ("echo-", "count-")] + builtin_tasks
    built = [await images(task) for task in chosen]
    episodes = (run_episode(t, provider, agent, image=i) for t, i in zip(chosen, built, strict=True))
    results = await asyncio.gather(*episodes)
    expected = 1.0 if agent.name == "oracle" else 0.0
    for t in results:
        assert t.status == "completed", t.error
        assert t.reward == expected and t.passed is (expected == 1.0), (t.task_id, t.verifier)
        assert t.verifier["exit_code"] is not None and t.sandbox_id is not None
        assert t.image is not None and t.image.startswith(f"task-{t.task_id}-")  # built, named after its task


async def test_refused_create_is_infra_error_not_reward_0(echo_task: Task, provider: BwrapProvider) -> None:
    refusing = RecordingProvider(provider, refuse=CapacityExhaustedError("the host is full"))
    t = await run_episode(echo_task, refusing, OracleAgent())
    assert t.status == "infra_error" and t.reward is None and t.passed is None
    assert t.error is not None and t.error.phase == "sandbox_create"
    assert t.error.error_code == "capacity_exhausted" and t.error.retryable and "full" in t.error.message
    assert not t.trainable


async def test_refusing_host_is_retried_then_counted(echo_task: Task, provider: BwrapProvider) -> None:
    refusing = RecordingProvider(provider, refuse=SandboxCreateError("sandbox did not start"))
    config = RunnerConfig(max_attempts=3, retry_backoff_s=0.01, group_size=2)
    result = await RolloutRunner(refusing, OracleAgent(), config=config, image_for=TaskImages(provider)).run(
        [echo_task]
    )
    assert refusing.refusals == 6
    for t in result.trajectories:
        assert t.status == "infra_error" and t.reward is None and t.attempt == 3
        assert [e.error_code for e in t.retried_errors] == ["create_failed", "create_failed"]
    assert result.summary["status"]["infra_error"] == 2 and result.summary["pass_rate"] is None


@dataclass
class KillServerAfter:
    """A policy over real HTTP whose server is stopped before the ``after``-th request, then restarted."""

    engine: Engine
    after: int
    calls: int = 0
    port: int = 0

    def __post_init__(self) -> None:
        self.server = BackgroundServer(create_app(self.engine)).start()
        self.port = self.server.port
        self.client = SGLangClient(self.server.url, http=HTTPConfig(retries=1, backoff_s=0.01))
        self.killed = threading.Event()

    async def generate(self, input_ids: list[int], params: SamplingParams) -> Generation:
        self.calls += 1
        if self.calls == self.after:
            await asyncio.to_thread(self.server.stop)
            self.killed.set()
        elif self.killed.is_set() and self.calls == self.after + 1:
            self.server = BackgroundServer(create_app(self.engine), port=self.port).start()
        return await self.client.generate(input_ids, params)

    async def update_weights(self, path: str) -> int:
        raise NotImplementedError

    async def health(self) -> None:
        await self.client.health()


async def test_inference_server_killed_mid_episode_is_infra_error_and_retried(
    echo_task: Task, provider: BwrapProvider, engine: Engine, tokenizer: ByteTokenizer
) -> None:
    policy = KillServerAfter(engine, after=2)
    agent = LLMAgent(tokenizer, LLMAgentConfig(sampling=SamplingParams(max_new_tokens=8)))
    episode = EpisodeConfig(Budget(max_turns=3))
    try:
        # On its own, the episode records the dead server as an infra error, not as reward 0.
        lost = await run_episode(echo_task, provider, agent, policy=policy, config=episode)
        assert lost.status == "infra_error" and lost.reward is None
        assert lost.error is not None and lost.error.error_code == "inference_unreachable" and lost.error.retryable
        # Through the runner it is retried; the server is back by then, and the retry completes.
        policy.calls, policy.after = 0, 2
        policy.killed.clear()
        policy.server = BackgroundServer(create_app(engine), port=policy.port).start()
        config = RunnerConfig(max_attempts=2, retry_backoff_s=0.01, episode=episode)
        result = await RolloutRunner(provider, agent, policy=policy, config=config).run([echo_task])
        (t,) = result.trajectories
        assert t.status == "truncated" and t.attempt == 2 and t.reward == 0.0
        assert [e.error_code for e in t.retried_errors] == ["inference_unreachable"]
    finally:
        policy.server.stop()
        await policy.client.aclose()


class SlowAgent:
    """Waits inside the sandbox until cancelled."""

    name = "slow"

    def __init__(self) -> None:
        self.started = asyncio.Event()

    async def run(self, task: Task, sandbox: Sandbox, policy: InferenceClient | None, budget: Budget) -> AgentResult:
        self.started.set()
        await sandbox.exec("sleep 60", timeout_s=120)
        return AgentResult("done")


async def test_cancel_mid_episode_leaves_no_sandbox(echo_task: Task, provider: BwrapProvider) -> None:
    recording = RecordingProvider(provider)
    agent = SlowAgent()
    episode = asyncio.ensure_future(run_episode(echo_task, recording, agent))
    await agent.started.wait()
    episode.cancel()
    with pytest.raises(asyncio.CancelledError):
        await episode
    (sandbox,) = recording.created
    assert recording.live == 0 and sandbox not in provider.live


async def test_cancel_a_run_closes_every_sandbox(tasks: list[Task], provider: BwrapProvider) -> None:
    recording = RecordingProvider(provider)
    agent = ReplayAgent(["true", "true"], ThinkTime(500, 500, 100.0))  # 5 s per turn
    config = RunnerConfig(concurrency=4, group_size=2)
    run = asyncio.ensure_future(
        RolloutRunner(recording, agent, config=config, image_for=TaskImages(provider)).run(tasks)
    )
    while recording.live < 4:
        await asyncio.sleep(0.02)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert recording.live == 0 and len(recording.created) == 4
    assert not any(s in provider.live for s in recording.created)


class BrokenAgent:
    name = "broken"

    async def run(self, task: Task, sandbox: Sandbox, policy: InferenceClient | None, budget: Budget) -> AgentResult:
        raise KeyError("a bug in the agent")


async def test_a_bug_in_the_agent_is_data(echo_task: Task, provider: BwrapProvider) -> None:
    recording = RecordingProvider(provider)
    t = await run_episode(echo_task, recording, BrokenAgent())
    assert t.status == "agent_error" and t.reward is None
    assert t.error is not None and t.error.error_code == "KeyError" and not t.error.retryable
    assert recording.live == 0


async def test_oracle_without_a_solution_is_an_agent_error(echo_task: Task, provider: BwrapProvider) -> None:
    import dataclasses

    bare = dataclasses.replace(echo_task, solution=None)
    t = await run_episode(bare, provider, OracleAgent())
    assert t.status == "agent_error" and t.error is not None and "no reference solution" in t.error.message
