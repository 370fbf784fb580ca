"""LLMAgent episodes: token-exact ids with the tiny model (in process and over HTTP), commands, budgets."""

from __future__ import annotations

import asyncio
import re

import pytest

from sandrl.inference.base import InferenceClient, SamplingParams
from sandrl.inference.engine import Engine
from sandrl.inference.sglang import SGLangClient
from sandrl.inference.tokenizer import ByteTokenizer
from sandrl.rollout import Budget, EpisodeConfig, LLMAgent, LLMAgentConfig, Trajectory, run_episode
from sandrl.rollout.agents.formats import FENCED_SYSTEM_PROMPT as SYSTEM_PROMPT
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.tasks import Task

from .conftest import ScriptedPolicy, answer_of, bash

OBSERVATION = re.compile(r"(<\|im_end\|>)?<\|im_start\|>tool\n(.*)<\|im_end\|><\|im_start\|>assistant\n", re.DOTALL)

FEW_TOKENS = LLMAgentConfig(sampling=SamplingParams(temperature=1.0, max_new_tokens=24, seed=7))


def assert_token_exact(t: Trajectory, task: Task, tokenizer: ByteTokenizer) -> list[str]:
    """The ids are the prompt, then per turn the model's ids and the rendered observation, and nothing else;
    the loss mask covers exactly the model's ids. Returns the observation texts."""
    t.check()
    opening = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task.instruction}]
    assert t.ids[: t.prompt_len] == tokenizer.encode_messages(opening, add_generation_prompt=True)
    observations = []
    pos = t.prompt_len
    for turn in t.turns:
        assert turn.output_start == pos == turn.context_tokens
        pos = turn.output_end
        if turn.observation_end > turn.observation_start:
            assert turn.observation_start == pos
            span = t.ids[turn.observation_start : turn.observation_end]
            closed = t.ids[pos - 1] in tokenizer.eos_token_ids
            match = OBSERVATION.fullmatch(tokenizer.decode(span))
            assert match is not None and (match.group(1) is None) == closed
            text = match.group(2)
            close = [] if closed else [tokenizer.im_end_id]
            assert span == close + tokenizer.encode_turn("tool", text) + tokenizer.assistant_prefix_ids()
            observations.append(text)
            pos = turn.observation_end
    assert pos == len(t.ids)
    expected = [0] * len(t.ids)
    for turn in t.turns:
        for i in range(turn.output_start, turn.output_end):
            expected[i] = 1
    assert t.loss_mask == expected
    assert all(lp == 0.0 for lp, m in zip(t.logprobs, t.loss_mask, strict=True) if not m)
    return observations


async def _llm_episode(task: Task, provider: BwrapProvider, policy: InferenceClient, tokenizer: ByteTokenizer) -> None:
    budget = Budget(max_turns=3, max_total_tokens=4096)
    t = await run_episode(
        task, provider, LLMAgent(tokenizer, FEW_TOKENS), policy=policy, config=EpisodeConfig(budget=budget)
    )
    assert t.status == "truncated" and t.stop_reason == "max_turns", t.error
    assert t.num_turns == 3 and t.reward == 0.0
    assert_token_exact(t, task, tokenizer)
    assert t.loss_mask[-1] == 1  # no observation after the last model turn
    assert any(lp < 0 for lp in t.logprobs)
    assert t.weight_version == 0 and all(turn.weight_version == 0 for turn in t.turns)
    assert t.timings.model_s > 0 and t.timings.total_s >= t.timings.phases_s * 0.99


async def test_tiny_model_in_process(
    echo_task: Task, provider: BwrapProvider, engine: Engine, tokenizer: ByteTokenizer
) -> None:
    await _llm_episode(echo_task, provider, engine, tokenizer)


async def test_tiny_model_over_http(
    echo_task: Task, provider: BwrapProvider, served_url: str, tokenizer: ByteTokenizer
) -> None:
    async with SGLangClient(served_url) as client:
        await _llm_episode(echo_task, provider, client, tokenizer)


async def test_logprobs_are_the_servers(echo_task: Task, provider: BwrapProvider, engine: Engine) -> None:
    """Greedy generation is deterministic: regenerating a turn from its context gives the same ids and log-probs."""
    assert engine.tokenizer is not None
    config = LLMAgentConfig(sampling=SamplingParams(temperature=0.0, max_new_tokens=16))
    t = await run_episode(
        echo_task, provider, LLMAgent(engine.tokenizer, config), policy=engine, config=EpisodeConfig(Budget(2))
    )
    turn = t.turns[1]
    again = await engine.generate(t.ids[: turn.output_start], config.sampling)
    assert again.output_ids == t.ids[turn.output_start : turn.output_end]
    assert again.output_logprobs == pytest.approx(t.logprobs[turn.output_start : turn.output_end], abs=1e-4)


async def test_commands_run_and_submit_scores(
    echo_task: Task, provider: BwrapProvider, tokenizer: ByteTokenizer
) -> None:
    word = answer_of(echo_task)
    policy = ScriptedPolicy(
        [bash("pwd"), "no block here", bash(f"echo {word} > answer.txt && cat answer.txt"), bash("submit")],
        versions=[3, 3, 4, 4],
    )
    t = await run_episode(echo_task, provider, LLMAgent(tokenizer), policy=policy)
    assert t.status == "completed" and t.stop_reason == "submitted" and t.reward == 1.0 and t.passed
    assert t.task_set == echo_task.source.parent.name != ""  # the directory its task came from
    assert [turn.command for turn in t.turns] == ["pwd", None, f"echo {word} > answer.txt && cat answer.txt", None]
    assert [turn.exit_code for turn in t.turns] == [0, None, 0, None]
    tools = assert_token_exact(t, echo_task, tokenizer)
    # Replies without special tokens: the ids are exactly the template's rendering of the conversation.
    messages, open_turn = tokenizer.parse_messages(t.ids)
    assert not open_turn and tokenizer.encode_messages(messages) == t.ids
    assert next(m["content"] for m in messages if m["role"] == "assistant") == bash("pwd")
    assert tools[0] == "exit code: 0\nstdout:\n/workspace\n"
    assert tools[1].startswith("No command found")
    assert tools[2] == f"exit code: 0\nstdout:\n{word}\n"
    # The weights changed between turns 1 and 2: recorded per turn; the trajectory carries the oldest.
    assert [turn.weight_version for turn in t.turns] == [3, 3, 4, 4]
    assert t.weight_version == 3 and t.weight_versions == [3, 4]
    assert policy.calls[1] == t.ids[: t.turns[1].output_start]  # each prompt is the conversation so far
    assert t.timings.sandbox_wait_s >= t.timings.command_s > 0


async def test_long_output_is_cut_head_and_tail(
    echo_task: Task, provider: BwrapProvider, tokenizer: ByteTokenizer
) -> None:
    policy = ScriptedPolicy([bash("seq 1 5000; echo oops >&2"), bash("submit")])
    agent = LLMAgent(tokenizer, LLMAgentConfig(observation_tokens=200))
    t = await run_episode(echo_task, provider, agent, policy=policy)
    observation = tokenizer.decode(t.ids[t.turns[0].observation_start : t.turns[0].observation_end])
    assert t.turns[0].output_truncated
    assert "stdout:\n1\n2\n3\n" in observation and "4999\n5000\n" in observation
    assert "tokens omitted" in observation and "stderr:\noops" in observation
    assert t.turns[0].observation_end - t.turns[0].observation_start < 300


async def test_max_turns_truncates_at_that_turn(
    echo_task: Task, provider: BwrapProvider, tokenizer: ByteTokenizer
) -> None:
    word = answer_of(echo_task)
    # The last allowed turn's command still runs (and is verified); nothing follows it.
    policy = ScriptedPolicy([bash("true"), bash(f"echo {word} > answer.txt"), bash("submit")])
    t = await run_episode(
        echo_task, provider, LLMAgent(tokenizer), policy=policy, config=EpisodeConfig(Budget(max_turns=2))
    )
    assert t.status == "truncated" and t.stop_reason == "max_turns"
    assert t.num_turns == 2 and len(policy.calls) == 2 and t.reward == 1.0
    assert t.turns[-1].observation_start == t.turns[-1].observation_end == len(t.ids)
    assert_token_exact(t, echo_task, tokenizer)


async def test_max_total_tokens_truncates(echo_task: Task, provider: BwrapProvider, tokenizer: ByteTokenizer) -> None:
    agent = LLMAgent(tokenizer)
    prompt = len(agent.prompt_ids(echo_task))
    reply = bash("echo " + "x" * 40)
    policy = ScriptedPolicy([reply])
    reply_len = len(tokenizer.encode(reply)) + 1
    # Room for two replies and one observation, not for a third reply.
    budget = Budget(max_turns=10, max_total_tokens=prompt + 2 * reply_len + 80)
    t = await run_episode(echo_task, provider, agent, policy=policy, config=EpisodeConfig(budget))
    assert t.status == "truncated" and t.stop_reason == "max_tokens"
    assert len(t.ids) <= budget.max_total_tokens
    assert t.num_turns == len(policy.calls) == 2
    assert t.loss_mask[-1] == 1


async def test_max_total_tokens_cuts_a_reply(
    echo_task: Task, provider: BwrapProvider, tokenizer: ByteTokenizer
) -> None:
    agent = LLMAgent(tokenizer)
    budget = Budget(max_turns=10, max_total_tokens=len(agent.prompt_ids(echo_task)) + 10)
    policy = ScriptedPolicy([bash("echo a long command that does not fit")])
    t = await run_episode(echo_task, provider, agent, policy=policy, config=EpisodeConfig(budget))
    assert t.stop_reason == "max_tokens" and t.num_turns == 1 and t.turns[0].command is None
    assert len(t.ids) == budget.max_total_tokens and t.turns[0].finish_reason == "length"


async def test_wall_time_truncates_a_slow_model(
    echo_task: Task, provider: BwrapProvider, tokenizer: ByteTokenizer
) -> None:
    policy = ScriptedPolicy([bash("true")], delay_s=0.4)
    budget = Budget(max_turns=50, wall_time_s=1.0)
    t = await run_episode(echo_task, provider, LLMAgent(tokenizer), policy=policy, config=EpisodeConfig(budget))
    assert t.status == "truncated" and t.stop_reason == "wall_time"
    assert t.num_turns == 2 and len(policy.calls) == 3  # the third generation was cut off: no ghost turn
    assert t.timings.agent_s < 1.3


async def test_wall_time_caps_a_command(echo_task: Task, provider: BwrapProvider, tokenizer: ByteTokenizer) -> None:
    policy = ScriptedPolicy([bash("sleep 30"), bash("submit")])
    t = await run_episode(
        echo_task, provider, LLMAgent(tokenizer), policy=policy, config=EpisodeConfig(Budget(wall_time_s=1.0))
    )
    assert t.status == "truncated" and t.stop_reason == "wall_time" and t.num_turns == 1
    assert t.turns[0].timed_out and t.timings.agent_s < 3
    assert t.reward == 0.0


async def test_engine_shut_down_mid_generation_is_infra(
    echo_task: Task, provider: BwrapProvider, tokenizer: ByteTokenizer
) -> None:
    eng = Engine.load("tiny")
    agent = LLMAgent(tokenizer, LLMAgentConfig(sampling=SamplingParams(max_new_tokens=2000, ignore_eos=True)))
    episode = asyncio.ensure_future(run_episode(echo_task, provider, agent, policy=eng))
    while eng.running == 0:
        await asyncio.sleep(0.01)
    await eng.aclose()
    t = await episode
    assert t.status == "infra_error" and t.reward is None
    assert t.error is not None and t.error.phase == "agent" and t.error.retryable
