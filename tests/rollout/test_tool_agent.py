"""The LLM agent in ``tools`` format: real sandboxes, the byte template's Hermes calls, token-exact ids."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sandrl.errors import ConfigError
from sandrl.inference.tokenizer import ByteTokenizer
from sandrl.rollout import LLMAgent, LLMAgentConfig, run_episode
from sandrl.rollout.agents.formats import TOOLS_SYSTEM_PROMPT
from sandrl.rollout.agents.tools import EDIT_MAX_BYTES, SANDBOX_TOOLS
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.tasks import Task

from .conftest import ScriptedPolicy, answer_of

TOOLS = LLMAgentConfig(format="tools")


def call(name: str, **arguments: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


async def test_tool_calls_run_in_the_sandbox_and_submit_scores(
    echo_task: Task, provider: BwrapProvider, tokenizer: ByteTokenizer
) -> None:
    word = answer_of(echo_task)
    replies = [
        "Let me look.\n" + call("bash", command="pwd"),
        call("write_file", path="answer.txt", content="draft\n")
        + "\n"
        + call("edit_file", path="answer.txt", old="draft", new=word),
        call("bash", command="cat answer.txt") + "\n" + call("submit"),
    ]  # fmt: skip
    policy = ScriptedPolicy(replies)
    t = await run_episode(echo_task, provider, LLMAgent(tokenizer, TOOLS), policy=policy)
    assert t.status == "completed" and t.stop_reason == "submitted" and t.reward == 1.0, t.error
    assert [turn.command for turn in t.turns] == ["pwd", None, "cat answer.txt"]
    assert t.turns[1].tool_calls == [
        {"name": "write_file", "arguments": {"path": "answer.txt", "content": "draft\n"}},
        {"name": "edit_file", "arguments": {"path": "answer.txt", "old": "draft", "new": word}},
    ]
    # Token-exact: the ids are the byte template's rendering of the conversation with its tools,
    # the model's replies as sampled and each call answered by a tool message.
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": TOOLS_SYSTEM_PROMPT},
        {"role": "user", "content": echo_task.instruction},
        {"role": "assistant", "content": replies[0]},
        {"role": "tool", "content": "exit code: 0\nstdout:\n/workspace\n"},
        {"role": "assistant", "content": replies[1]},
        {"role": "tool", "content": "wrote 6 bytes to /workspace/answer.txt"},
        {"role": "tool", "content": "edited /workspace/answer.txt"},
        {"role": "assistant", "content": replies[2]},
    ]
    assert t.ids == tokenizer.encode_messages(messages, tools=SANDBOX_TOOLS)
    for turn, seen in zip(t.turns, policy.calls, strict=True):
        assert seen == t.ids[: turn.output_start]  # the engine's input was exactly the recorded prefix
    assert t.loss_mask == [
        1 if any(turn.output_start <= i < turn.output_end for turn in t.turns) else 0 for i in range(len(t.ids))
    ]


async def test_malformed_calls_are_observations_not_errors(
    echo_task: Task, provider: BwrapProvider, tokenizer: ByteTokenizer
) -> None:
    replies = [
        "<tool_call>\n{not json}\n</tool_call>",
        call("rm_rf", path="/"),
        call("bash"),
        call("bash", command=7),
        "no call at all",
        call("submit"),
    ]
    t = await run_episode(echo_task, provider, LLMAgent(tokenizer, TOOLS), policy=ScriptedPolicy(replies))
    assert t.status == "completed" and t.stop_reason == "submitted" and t.reward == 0.0 and t.error is None
    assert t.num_turns == 6 and all(turn.command is None for turn in t.turns)
    shown = [tokenizer.decode(t.ids[turn.observation_start : turn.observation_end]) for turn in t.turns[:5]]
    assert "not valid JSON" in shown[0] and "No valid tool call" in shown[0]
    assert "rm_rf" in shown[1] and "bash" in shown[1]  # the unknown tool, and the ones that exist
    assert "command" in shown[2]  # the missing argument
    assert "command" in shown[3] and "string" in shown[3]  # the wrong type
    assert "No valid tool call" in shown[4]
    assert t.turns[1].tool_calls is not None and "error" in t.turns[1].tool_calls[0]


async def test_a_subset_of_tools_is_offered(echo_task: Task, tokenizer: ByteTokenizer) -> None:
    agent = LLMAgent(tokenizer, LLMAgentConfig(format="tools", tools=("bash",)))
    prompt = tokenizer.decode(agent.prompt_ids(echo_task))
    assert "bash(command: string, timeout_s?: number)" in prompt and "write_file" not in prompt
    with pytest.raises(ConfigError, match="unknown tools"):
        LLMAgent(tokenizer, LLMAgentConfig(format="tools", tools=("sudo",)))
    with pytest.raises(ConfigError, match="format"):
        LLMAgentConfig(format="xml")  # type: ignore[arg-type]


async def test_edit_file_refuses_a_file_over_its_bound_and_a_missing_one(
    echo_task: Task, provider: BwrapProvider, tokenizer: ByteTokenizer
) -> None:
    """The sandbox's files are hostile: edit_file reads at most EDIT_MAX_BYTES, and says so past that."""
    replies = [
        call("bash", command=f"head -c {EDIT_MAX_BYTES + 1} /dev/zero | tr '\\0' a > big.txt"),
        call("edit_file", path="big.txt", old="a", new="b"),
        call("edit_file", path="nope.txt", old="a", new="b"),
        call("submit"),
    ]
    t = await run_episode(echo_task, provider, LLMAgent(tokenizer, TOOLS), policy=ScriptedPolicy(replies))
    assert t.status == "completed" and t.error is None
    shown = [tokenizer.decode(t.ids[turn.observation_start : turn.observation_end]) for turn in t.turns[1:3]]
    assert f"larger than {EDIT_MAX_BYTES} bytes" in shown[0]
    assert "error:" in shown[1]
