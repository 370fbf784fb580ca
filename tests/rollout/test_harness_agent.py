"""Harness agents: mini-swe-agent (the real PyPI package) and a module:function harness, driving real
sandboxes through a real session gateway, their trajectories recorded token-exact."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import openai
import pytest

from sandrl.inference.engine import Engine
from sandrl.inference.tokenizer import ByteTokenizer
from sandrl.rollout import Budget, EpisodeConfig, Trajectory, run_episode
from sandrl.rollout.agents.harness import HarnessContext
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.tasks import Task
from sandrl.train.adapter import segment_samples
from sandrl.wiring import RolloutConfig, open_agent

from .conftest import ScriptedPolicy, answer_of

pytest.importorskip("minisweagent", reason="the harness extra is not installed: pip install -e '.[harness]'")


@dataclass
class ScriptedWithTokenizer(ScriptedPolicy):
    """The scripted policy with what a gateway needs of a policy: its tokenizer and context."""

    @property
    def tokenizer(self) -> ByteTokenizer:
        return ByteTokenizer()

    @property
    def max_context(self) -> int:
        return 8192


def bash_call(command: str) -> str:
    return (
        "Running it.\n<tool_call>\n"
        + json.dumps({"name": "bash", "arguments": {"command": command}})
        + "\n</tool_call>"
    )


def assert_token_exact(t: Trajectory, policy: ScriptedPolicy) -> None:
    t.check()
    for turn, seen in zip(t.turns, policy.calls, strict=True):
        segment = max(s for s in t.segment_starts if s <= turn.output_start)
        assert seen == t.ids[segment : turn.output_start]  # the engine's input was exactly the recorded segment
    assert t.loss_mask == [
        1 if any(turn.output_start <= i < turn.output_end for turn in t.turns) else 0 for i in range(len(t.ids))
    ]


async def test_mini_swe_agent_solves_a_task_through_the_gateway(echo_task: Task, provider: BwrapProvider) -> None:
    word = answer_of(echo_task)
    commands = [f"echo {word} > answer.txt", "cat answer.txt", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"]
    policy = ScriptedWithTokenizer([bash_call(c) for c in commands])
    async with open_agent(RolloutConfig(agent="mini-swe-agent"), policy) as agent:  # type: ignore[arg-type]
        t = await run_episode(echo_task, provider, agent, policy=policy)  # type: ignore[arg-type]
    assert t.agent == "mini-swe-agent"
    assert t.status == "completed" and t.stop_reason == "submitted" and t.reward == 1.0, t.error
    assert [turn.command for turn in t.turns] == [
        f"echo {word} > answer.txt",
        "cat answer.txt",
        "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT",
    ]
    assert t.segment_starts == [0] and t.turns[1].exit_code == 0
    assert_token_exact(t, policy)
    # mini-swe-agent's own prompt and its tool-result message are in the ids, rendered by the template.
    text = ByteTokenizer().decode(t.ids)
    assert "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in text[: t.prompt_len * 2] and '"returncode": 0' in text
    import litellm  # the episode's cached clients are closed with it (each session is an endpoint of its own)

    cached = litellm.in_memory_llm_clients_cache.cache_dict.values()
    assert not any("/v1/sessions/" in str(getattr(c, "base_url", "")) for c in cached)


async def rewriting_harness(ctx: HarnessContext) -> str:
    """A harness that summarises its history after the first turn (so the second call starts a segment)."""
    async with openai.AsyncOpenAI(base_url=ctx.base_url, api_key=ctx.api_key, max_retries=0) as client:
        messages: list[Any] = [{"role": "user", "content": ctx.task.instruction}]
        first = await client.chat.completions.create(model=ctx.model, messages=messages, max_tokens=16)
        result = await ctx.exec("echo one")
        messages = [
            {"role": "user", "content": "(summary) " + ctx.task.instruction},
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "user", "content": result.stdout},
        ]
        await client.chat.completions.create(model=ctx.model, messages=messages, max_tokens=16)
        two = await ctx.exec(["echo", "two", "$X;"])  # an argv: no shell, recorded as a shell line
        assert two.stdout == "two $X;\n", two
    return "done"


async def test_a_harness_that_rewrites_history_gets_segments(echo_task: Task, provider: BwrapProvider) -> None:
    policy = ScriptedWithTokenizer(["first reply", "second reply"])
    rollout = RolloutConfig(agent=f"{__name__}:rewriting_harness")
    async with open_agent(rollout, policy) as agent:  # type: ignore[arg-type]
        t = await run_episode(echo_task, provider, agent, policy=policy)  # type: ignore[arg-type]
    assert t.status == "completed" and t.stop_reason == "done" and t.reward == 0.0, t.error
    assert len(t.segment_starts) == 2 and t.segment_starts[1] == t.turns[0].output_end
    assert [turn.command for turn in t.turns] == ["echo one", "echo two '$X;'"]
    assert_token_exact(t, policy)
    samples = segment_samples(t)
    assert [s.token_ids for s in samples] == [tuple(t.ids[a:b]) for a, b in t.segments()]


async def test_mini_swe_agent_with_the_tiny_model(echo_task: Task, provider: BwrapProvider, engine: Engine) -> None:
    """The real tiny model writes no valid call: every turn is a format error, yet nothing is an infra error."""
    rollout = RolloutConfig(agent="mini-swe-agent", max_new_tokens=16)
    async with open_agent(rollout, engine) as agent:
        t = await run_episode(
            echo_task, provider, agent, policy=engine, config=EpisodeConfig(Budget(max_turns=2, max_total_tokens=2048))
        )
    assert t.status in ("completed", "truncated") and t.error is None, t.error
    assert 1 <= t.num_turns <= 2 and any(t.loss_mask) and t.weight_version == 0
