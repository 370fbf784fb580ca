"""The runner records how long each episode's model calls waited for the engines' KV room
(``timings.kv_wait_s``) and the run's gate in its summary, for sandrl's agent and for a harness whose calls
go through the session gateway."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import openai
import pytest

from sandrl.inference.base import SamplingParams
from sandrl.inference.engine import Engine
from sandrl.inference.fleet.config import AdmissionConfig
from sandrl.inference.kv_admission import AdmittedPolicy, KVAdmission
from sandrl.inference.kv_capacity import KVCapacity
from sandrl.inference.tokenizer import ByteTokenizer
from sandrl.rollout import Budget, EpisodeConfig, LLMAgent, LLMAgentConfig, RolloutRunner, RunnerConfig, Trajectory
from sandrl.rollout.agents.harness import HarnessContext
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.tasks import Task
from sandrl.wiring import RolloutConfig, open_agent

from .conftest import ScriptedPolicy

FULL = KVCapacity(running=8, queued=0, used_tokens=4096, total_tokens=4096)
"""Someone else's requests fill the engines: calls wait until a reading says otherwise."""
GATE = AdmissionConfig(interval_s=0.05)


@dataclass
class FullAtFirst:
    """The engines' reading: full for the first ``full`` readings, then the real engine's (or a roomy one)."""

    engine: Engine | None = None
    full: int = 2
    asked: int = 0

    async def kv_capacity(self) -> KVCapacity:
        self.asked += 1
        if self.asked <= self.full:
            return FULL
        if self.engine is not None:
            return await self.engine.kv_capacity()
        return KVCapacity(running=0, queued=0, used_tokens=0, total_tokens=4096)


def check_recorded(trajectories: list[Trajectory], summary: dict[str, Any], gate: KVAdmission) -> None:
    waits = [t.timings.kv_wait_s for t in trajectories]
    assert max(waits) >= 2 * GATE.interval_s * 0.9  # the first calls sat through two full readings
    assert sum(waits) == pytest.approx(gate.wait_s, abs=1e-3)  # every wait is some episode's
    assert all(t.timings.model_s >= t.timings.kv_wait_s for t in trajectories)  # a part of the model's time
    assert summary["kv_admission"] == gate.stats() and summary["kv_admission"]["waited"] > 0
    assert "kv_wait_s" in summary["phases_s"]
    for t in trajectories:
        assert Trajectory.from_dict(json.loads(json.dumps(t.to_dict()))).timings == t.timings


async def test_the_llm_agents_episodes_record_their_wait(
    echo_task: Task, provider: BwrapProvider, engine: Engine
) -> None:
    gate = KVAdmission(FullAtFirst(engine), GATE)
    policy = AdmittedPolicy(engine, gate)
    agent = LLMAgent(ByteTokenizer(), LLMAgentConfig(sampling=SamplingParams(max_new_tokens=8)))
    config = RunnerConfig(group_size=3, episode=EpisodeConfig(Budget(max_turns=2)))
    result = await RolloutRunner(provider, agent, policy=policy, config=config).run([echo_task])
    assert all(t.status in ("completed", "truncated") for t in result.trajectories)
    check_recorded(result.trajectories, result.summary, gate)


@dataclass
class Scripted(ScriptedPolicy):
    """The scripted policy with what a gateway needs of a policy."""

    @property
    def tokenizer(self) -> ByteTokenizer:
        return ByteTokenizer()

    @property
    def max_context(self) -> int:
        return 8192


async def two_turn_harness(ctx: HarnessContext) -> str:
    async with openai.AsyncOpenAI(base_url=ctx.base_url, api_key=ctx.api_key, max_retries=0) as client:
        messages: list[Any] = [{"role": "user", "content": ctx.task.instruction}]
        first = await client.chat.completions.create(model=ctx.model, messages=messages, max_tokens=16)
        result = await ctx.exec("echo one")
        messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": result.stdout}]
        await client.chat.completions.create(model=ctx.model, messages=messages, max_tokens=16)
    return "done"


async def test_a_harness_through_the_gateway_records_its_wait(echo_task: Task, provider: BwrapProvider) -> None:
    gate = KVAdmission(FullAtFirst(), GATE)
    policy = AdmittedPolicy(Scripted(["first reply", "second reply"]), gate)
    rollout = RolloutConfig(agent=f"{__name__}:two_turn_harness")
    async with open_agent(rollout, policy) as agent:
        result = await RolloutRunner(provider, agent, policy=policy, config=RunnerConfig(group_size=2)).run([echo_task])
    assert all(t.status == "completed" and t.num_turns == 2 for t in result.trajectories), result.trajectories[0].error
    check_recorded(result.trajectories, result.summary, gate)
