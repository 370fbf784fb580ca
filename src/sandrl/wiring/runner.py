"""A :class:`~sandrl.rollout.runner.RolloutRunner` from a :class:`~sandrl.wiring.config.RolloutConfig`.

The one place the ``[rollout]`` settings become the rollout components: the runner's config (its
episode budget and per-phase timeouts included) and the LLM agent with its sampling. Training,
``sandrl eval``, ``sandrl tasks run``, the cluster's rollout workers, the demo and the benchmarks
all build their runner here, so a setting means the same thing in each.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, cast

from sandrl.errors import ConfigError
from sandrl.inference.base import InferenceClient, SamplingParams
from sandrl.rollout.agent import Agent, Budget
from sandrl.rollout.agents.formats import AgentFormat
from sandrl.rollout.agents.llm import LLMAgent, LLMAgentConfig
from sandrl.rollout.episode import EpisodeConfig
from sandrl.rollout.images import ImageFor
from sandrl.rollout.jsonl import TrajectoryWriter
from sandrl.rollout.runner import RolloutRunner, RunnerConfig
from sandrl.rollout.trajectory import Trajectory
from sandrl.sandbox.base import SandboxProvider
from sandrl.wiring.config import RolloutConfig

if TYPE_CHECKING:
    from sandrl.sandbox.bwrap import BwrapProvider


def runner_config(rollout: RolloutConfig, *, run_id: str | None = None, max_context: int | None = None) -> RunnerConfig:
    """The runner's config of ``rollout``; the token budget is capped at ``max_context`` (the policy's).

    A conversation longer than the model's context cannot be generated from: the budget ends the
    episode as truncated there, instead of the next turn failing.
    """
    max_total = rollout.max_total_tokens if max_context is None else min(rollout.max_total_tokens, max_context)
    return rollout.runner(
        host_capacity=rollout.slots(),
        run_id=run_id,
        episode=EpisodeConfig(
            budget=Budget(max_turns=rollout.max_turns, max_total_tokens=max_total, wall_time_s=rollout.wall_time_s),
            timeouts=rollout.timeouts,
        ),
    )


def llm_agent(rollout: RolloutConfig, policy: InferenceClient) -> LLMAgent:
    """The LLM agent of ``rollout``, rendering its prompts with the policy's tokenizer."""
    tokenizer = policy.tokenizer
    if tokenizer is None:
        raise ConfigError(
            "the LLM agent needs the policy's tokenizer and the policy has none: the model (--model, [model] name) "
            "must be 'tiny' or a checkpoint directory with its tokenizer files, readable where the rollouts run"
        )
    config = LLMAgentConfig(
        sampling=SamplingParams(temperature=rollout.temperature, max_new_tokens=rollout.max_new_tokens),
        observation_tokens=rollout.observation_tokens,
        command_timeout_s=rollout.command_timeout_s,
        system_prompt=rollout.system_prompt or None,
        format=cast(AgentFormat, rollout.format),
        tool_parser=rollout.tool_parser or None,
        tools=rollout.tool_names(),
    )
    return LLMAgent(tokenizer, config)


@contextlib.asynccontextmanager
async def open_agent(rollout: RolloutConfig, policy: InferenceClient) -> AsyncIterator[Agent]:
    """The model-driven agent of ``[rollout] agent``: sandrl's LLM agent, or a harness behind a session gateway.

    A harness agent (``mini-swe-agent``, ``module:function``) gets a :class:`~sandrl.inference.gateway.Gateway`
    in front of ``policy``, served on this event loop on a loopback port for as long as the context lasts; a CLI
    agent (``claude-code``, ``codex``) also has its pinned version fetched first (:mod:`sandrl.rollout.agents.cli`)."""
    if rollout.agent == "llm":
        yield llm_agent(rollout, policy)
        return
    from sandrl.background_server import serve_on_loop
    from sandrl.inference.gateway import Gateway, create_gateway_app
    from sandrl.rollout.agents.cli import CLI_AGENTS, CliAgent, cli_install
    from sandrl.rollout.agents.harness import HarnessAgent, load_harness

    install = None
    if rollout.agent in CLI_AGENTS:
        install = cli_install(rollout.agent, rollout.cli_agents)
        await install.prepare()  # a version that does not exist ends the run here, before any episode
    else:
        harness = load_harness(rollout.agent)
    gateway = Gateway(policy, model_name=GATEWAY_MODEL_NAME, tool_parser=rollout.tool_parser or None)
    async with serve_on_loop(create_gateway_app(gateway), name="session gateway") as url:
        if install is not None:
            yield CliAgent(
                install,
                rollout.cli_agents,
                gateway,
                url,
                command_timeout_s=rollout.command_timeout_s,
                temperature=rollout.temperature,
                max_new_tokens=rollout.max_new_tokens,
            )
        else:
            yield HarnessAgent(
                harness,
                gateway,
                url,
                name=rollout.agent,
                command_timeout_s=rollout.command_timeout_s,
                temperature=rollout.temperature,
                max_new_tokens=rollout.max_new_tokens,
            )


GATEWAY_MODEL_NAME = "sandrl-policy"
"""The model name a harness's client sends to the session gateway (which serves one policy)."""


def build_runner(
    rollout: RolloutConfig,
    provider: SandboxProvider,
    *,
    policy: InferenceClient | None = None,
    agent: Agent | None = None,
    run_id: str | None = None,
    writer: TrajectoryWriter | None = None,
    image_for: ImageFor | None = None,
    on_episode: Callable[[Trajectory], None] | None = None,
) -> RolloutRunner:
    """The runner of ``rollout`` on ``provider``: ``agent``, or the LLM agent of ``rollout`` on ``policy``.

    ``run_id`` prefixes the group and episode ids (None: random); ``writer`` records every
    trajectory; ``image_for`` names the image of a task's sandboxes (default: built on ``provider``).
    """
    if agent is None:
        if policy is None:
            raise ConfigError("the LLM agent needs a policy: pass --inference URL or --inference embedded")
        if rollout.agent != "llm":
            raise ConfigError(
                f"the agent {rollout.agent!r} runs behind a session gateway, which this entry point does not start; "
                "build the runner inside sandrl.wiring.open_agent (sandrl eval and sandrl train do)"
            )
        agent = llm_agent(rollout, policy)
    config = runner_config(rollout, run_id=run_id, max_context=policy.max_context if policy is not None else None)
    return RolloutRunner(
        provider, agent, policy=policy, config=config, image_for=image_for, writer=writer, on_episode=on_episode
    )


def local_provider(state_dir: Path | None = None) -> BwrapProvider:
    """The sandboxes of this machine (bubblewrap), for a run given no provider; their state and
    image store under ``state_dir`` (default: the host's)."""
    from sandrl.sandbox.bwrap import BwrapProvider

    return BwrapProvider(state_dir)
