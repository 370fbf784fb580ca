"""Claude Code and Codex as they ship, inside the episode's sandbox, through the episode's gateway session.

A scripted policy replays a fixed tool-using reply sequence through the gateway (the CLI's own API:
Anthropic Messages for Claude Code, OpenAI Responses for Codex, streamed); the CLI runs the tool in the
sandbox, the verifier scores what it left: reward 1, and every id the policy saw is the recorded
segment. The tiny model runs episodes through them with no infra error (its 2,048-token context cannot
hold their prompts: each ends ``truncated`` on its first call).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from sandrl.background_server import BackgroundServer, serve_on_loop
from sandrl.inference.base import Generation, SamplingParams
from sandrl.inference.engine import Engine
from sandrl.inference.gateway import Gateway, Session, create_gateway_app
from sandrl.inference.tokenizer import ByteTokenizer
from sandrl.rollout import Trajectory
from sandrl.rollout.agents.cli import CLI_AGENTS
from sandrl.rollout.agents.cli.harness import FORWARD_PORTS, _forward
from sandrl.sandbox.base import forward_port
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.tasks import Task
from sandrl.wiring import RolloutConfig, build_runner, open_agent

from .conftest import ScriptedPolicy, answer_of


@dataclass
class ScriptedWithTokenizer(ScriptedPolicy):
    """The scripted policy with what a gateway needs of a policy: its tokenizer and a context for a CLI's
    long prompt (Claude Code's system prompt and tools are some 50,000 bytes: as many byte tokens)."""

    @property
    def tokenizer(self) -> ByteTokenizer:
        return ByteTokenizer()

    @property
    def max_context(self) -> int:
        return 1 << 20


def tool_call(name: str, arguments: dict[str, Any]) -> str:
    return "Running it.\n<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


SHELL_TOOL = {"claude-code": ("Bash", "command"), "codex": ("exec_command", "cmd")}
"""Each CLI's tool that runs a shell command, and its argument."""


def assert_token_exact(t: Trajectory, policy: ScriptedPolicy) -> None:
    t.check()
    assert len(t.turns) == len(policy.calls)
    for turn, seen in zip(t.turns, policy.calls, strict=True):
        segment = max(s for s in t.segment_starts if s <= turn.output_start)
        assert seen == t.ids[segment : turn.output_start]  # the engine's input was exactly the recorded segment
    assert t.loss_mask == [
        1 if any(turn.output_start <= i < turn.output_end for turn in t.turns) else 0 for i in range(len(t.ids))
    ]


def rollout_for(agent: str, **given: Any) -> RolloutConfig:
    settings: dict[str, Any] = {
        "agent": agent,
        "group_size": 1,
        "max_turns": 4,
        "max_total_tokens": 400_000,
        "max_new_tokens": 256,
    }
    settings.update(given)
    return RolloutConfig(**settings)


@pytest.mark.parametrize("name", sorted(CLI_AGENTS))
async def test_a_cli_agent_solves_a_task_through_the_gateway(
    name: str, echo_task: Task, provider: BwrapProvider
) -> None:
    word = answer_of(echo_task)
    tool, argument = SHELL_TOOL[name]
    policy = ScriptedWithTokenizer([tool_call(tool, {argument: f"echo {word} > /workspace/answer.txt"}), "Done."])
    rollout = rollout_for(name)
    async with open_agent(rollout, policy) as agent:  # type: ignore[arg-type]
        result = await build_runner(rollout, provider, policy=policy, agent=agent).run([echo_task])  # type: ignore[arg-type]
    (t,) = result.trajectories
    assert t.agent == name and t.image is not None and t.image.startswith(f"{name}-")
    assert t.status == "completed" and t.stop_reason == "done" and t.reward == 1.0, (t.error, t.agent_logs)
    assert len(t.turns) == len(policy.calls) == 2
    assert_token_exact(t, policy)
    assert t.turns[0].tool_calls and t.turns[0].tool_calls[0]["function"]["name"] == tool
    assert '"type":"' in t.agent_logs["stdout"] and len(t.agent_logs["stdout"]) <= 65536


@pytest.mark.parametrize("name", sorted(CLI_AGENTS))
async def test_the_tiny_model_runs_cli_episodes_without_infra_errors(
    name: str, echo_task: Task, provider: BwrapProvider, engine: Engine
) -> None:
    rollout = rollout_for(name, group_size=2, max_turns=2, max_total_tokens=4096, max_new_tokens=64)
    async with open_agent(rollout, engine) as agent:
        result = await build_runner(rollout, provider, policy=engine, agent=agent).run([echo_task])
    assert len(result.trajectories) == 2
    for t in result.trajectories:
        # The CLIs' own prompts (tens of thousands of byte tokens) are over the tiny model's 2,048: the
        # gateway refuses the first call for the budget, the CLI ends on it, the verifier scores.
        assert t.status == "truncated" and t.stop_reason == "max_tokens", (t.error, t.agent_logs)
        assert t.error is None and t.reward == 0.0 and t.agent_logs["stdout"]


@pytest.mark.parametrize("name", sorted(CLI_AGENTS))
async def test_the_turn_budget_ends_the_cli_and_the_verifier_still_scores(
    name: str, echo_task: Task, provider: BwrapProvider
) -> None:
    """The gateway refuses the call after the last turn; the CLI ends on the refusal (or is killed after
    ``stop_grace_s``), the episode is ``truncated`` at ``max_turns``, and what the one turn did is scored."""
    word = answer_of(echo_task)
    tool, argument = SHELL_TOOL[name]
    policy = ScriptedWithTokenizer([tool_call(tool, {argument: f"echo {word} > /workspace/answer.txt"})])
    rollout = rollout_for(name, max_turns=1)
    async with open_agent(rollout, policy) as agent:  # type: ignore[arg-type]
        result = await build_runner(rollout, provider, policy=policy, agent=agent).run([echo_task])  # type: ignore[arg-type]
    (t,) = result.trajectories
    assert t.status == "truncated" and t.stop_reason == "max_turns" and t.reward == 1.0, (t.error, t.agent_logs)
    assert len(policy.calls) == 1 and len(t.turns) == 1
    assert t.timings.agent_s < 15, t.timings  # ended on the refusal, not at the wall time
    assert_token_exact(t, policy)


async def test_the_wall_time_ends_the_cli_and_keeps_its_logs(echo_task: Task, provider: BwrapProvider) -> None:
    tool, argument = SHELL_TOOL["codex"]
    policy = ScriptedWithTokenizer([tool_call(tool, {argument: "sleep 120"})])
    rollout = rollout_for("codex", wall_time_s=8.0)
    async with open_agent(rollout, policy) as agent:  # type: ignore[arg-type]
        result = await build_runner(rollout, provider, policy=policy, agent=agent).run([echo_task])  # type: ignore[arg-type]
    (t,) = result.trajectories
    assert t.status == "truncated" and t.stop_reason == "wall_time" and t.reward == 0.0, (t.error, t.agent_logs)
    assert 4 < t.timings.agent_s < 10, t.timings
    assert "sleep 120" in t.agent_logs["stdout"]  # read after the CLI was ended


async def test_the_gateway_is_forwarded_past_a_port_the_task_already_listens_on(
    echo_task: Task, provider: BwrapProvider
) -> None:
    """A task's own service on the first port the CLI's forward would take: the next one is taken."""
    async with await provider.create(echo_task.to_sandbox_spec()) as sandbox:
        server = await sandbox.exec(
            f'python3 -c \'import socket,os; s=socket.socket(); s.bind(("127.0.0.1", {FORWARD_PORTS[0]})); '
            "s.listen(); os.fork() and os._exit(0); import time; time.sleep(60)'",
            timeout_s=10,
        )
        assert server.exit_code == 0, server.stderr
        with BackgroundServer(FastAPI()) as gateway:
            host, port = gateway.url.removeprefix("http://").split(":")
            forward = await _forward(sandbox, (host, int(port)))
            assert forward.port == FORWARD_PORTS[1]
            reached = await sandbox.exec(
                f"python3 -c 'import urllib.request as u; u.urlopen(\"http://127.0.0.1:{forward.port}/none\")'",
                timeout_s=10,
            )
            assert "404" in reached.stderr  # the gateway's answer, through the second port


async def test_a_sandbox_reaches_only_the_session_bound_to_it(echo_task: Task, provider: BwrapProvider) -> None:
    """Through its forward a sandbox's requests reach its own session and no other, whatever key they
    carry; and its session answers to nobody else, not even a client on the host with the key."""
    gateway = Gateway(ScriptedWithTokenizer(["unused"]), model_name="m")  # type: ignore[arg-type]
    mine, other = gateway.open(), gateway.open()
    async with (
        serve_on_loop(create_gateway_app(gateway)) as url,
        await provider.create(echo_task.to_sandbox_spec()) as sandbox,
    ):
        forward = await forward_port(sandbox, FORWARD_PORTS[0], ("127.0.0.1", int(url.rsplit(":", 1)[1])))
        mine.sandbox = forward.tag  # as the CLI's harness binds it

        async def from_sandbox(session: Session) -> str:
            result = await sandbox.exec(
                f"curl -sS -o /dev/null -w '%{{http_code}}' -H 'Authorization: Bearer {session.key}' "
                f"http://127.0.0.1:{forward.port}/v1/sessions/{session.id}/models",
                timeout_s=10,
            )
            return result.stdout

        async with httpx.AsyncClient() as host:

            async def from_host(session: Session) -> int:
                auth = {"Authorization": f"Bearer {session.key}"}
                return (await host.get(f"{url}/v1/sessions/{session.id}/models", headers=auth)).status_code

            assert await from_sandbox(mine) == "200"
            assert await from_sandbox(other) == "403"  # its own key, but not this sandbox's session
            assert await from_host(mine) == 403  # bound: only through its sandbox's forward
            assert await from_host(other) == 200  # an in-process harness's session, as before


async def test_each_turn_is_sampled_as_the_run_says(echo_task: Task, provider: BwrapProvider) -> None:
    """Codex sends no max_output_tokens and no temperature: its turns still take at most the run's
    max_new_tokens, at the run's temperature (and Codex gives up on a reply cut at the cap: the policy's
    failure, an agent error naming why)."""
    policy = ScriptedWithTokenizer(["x" * 400])
    seen: list[SamplingParams] = []
    scripted = policy.generate

    async def generate(input_ids: list[int], params: SamplingParams) -> Generation:
        seen.append(params)
        return await scripted(input_ids, params)

    policy.generate = generate  # type: ignore[method-assign]
    rollout = rollout_for("codex", max_new_tokens=32, temperature=0.0)
    async with open_agent(rollout, policy) as agent:  # type: ignore[arg-type]
        result = await build_runner(rollout, provider, policy=policy, agent=agent).run([echo_task])  # type: ignore[arg-type]
    (t,) = result.trajectories
    assert len(t.turns) == 1 and t.turns[0].finish_reason == "length", (t.error, t.agent_logs)
    assert t.turns[0].output_end - t.turns[0].output_start == 32
    assert t.status == "agent_error" and t.error is not None and "max_output_tokens" in t.error.message
    assert [(p.max_new_tokens, p.temperature) for p in seen] == [(32, 0.0)]
