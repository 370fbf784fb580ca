"""``sandrl eval``: run an agent over a task set and report (and optionally save) every episode.

::

    sandrl eval builtin --agent oracle
    sandrl eval tasks/ --agent llm --inference embedded --model tiny --samples 4 --out rollouts.jsonl
    sandrl eval tasks/ --agent llm --inference http://127.0.0.1:30000 --model /ckpt/step-10

The policy for ``--agent llm`` is the embedded engine (``--inference embedded``, loading
``--model``) or a server with SGLang's routes (``--inference URL``); over HTTP ``--model``
names where the tokenizer is (``tiny``: the byte tokenizer; a checkpoint directory: its files).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rich.console import Console

from sandrl.errors import ConfigError
from sandrl.inference.base import InferenceClient, SamplingParams
from sandrl.inference.tokenizer import ByteTokenizer, Tokenizer, load_tokenizer
from sandrl.rollout.agent import Agent, Budget
from sandrl.rollout.episode import EpisodeConfig
from sandrl.rollout.jsonl import TrajectoryWriter
from sandrl.rollout.llm_agent import SYSTEM_PROMPT, LLMAgent, LLMAgentConfig
from sandrl.rollout.runner import RolloutRunner, RunnerConfig, RunResult
from sandrl.rollout.scripted import DEFAULT_REPLAY, NullAgent, OracleAgent, ReplayAgent, ThinkTime
from sandrl.rollout.summary import print_summary
from sandrl.sandbox.base import SandboxProvider
from sandrl.tasks.loader import load_tasks
from sandrl.tasks.task import Task

AgentName = Literal["llm", "oracle", "null", "replay"]
AGENTS: tuple[AgentName, ...] = ("llm", "oracle", "null", "replay")


@dataclass(frozen=True)
class EvalConfig:
    """Everything ``sandrl eval`` takes; each field is one command-line option."""

    tasks: str
    """A task directory, a directory of them, a SWE-bench file, or ``builtin`` (the shipped suite)."""
    agent: AgentName = "oracle"
    inference: str | None = None
    """``embedded`` or the URL of a server with SGLang's routes; needed by ``--agent llm`` only."""
    model: str = "tiny"
    samples: int = 1
    """Episodes per task (a GRPO group)."""
    concurrency: int = 8
    out: Path | None = None
    """Write every trajectory here as JSONL (``--save-rollouts``)."""
    max_turns: int = 20
    max_total_tokens: int = 8192
    max_new_tokens: int = 512
    temperature: float = 1.0
    replay: Sequence[str] = field(default_factory=lambda: DEFAULT_REPLAY)
    """The replay agent's commands (``@solution`` = the task's solution)."""
    think_s: tuple[float, float] = (1.0, 2.0)
    """The replay agent's emulated model time per turn, low and high."""
    run_id: str | None = None
    max_attempts: int = 3
    system_prompt: str = SYSTEM_PROMPT
    """The LLM agent's system prompt (the one the policy was trained with)."""
    host_capacity: int | None = None
    """Commands at once across the sandboxes, the rest queue (``RunnerConfig.host_capacity``)."""

    def __post_init__(self) -> None:
        if self.host_capacity is not None and self.host_capacity < 1:
            raise ConfigError(f"--host-capacity must be at least 1 command at once, got {self.host_capacity}")
        if self.agent not in AGENTS:
            raise ConfigError(f"--agent must be one of {', '.join(AGENTS)}, got {self.agent!r}")
        if self.agent == "llm" and not self.inference:
            raise ConfigError("--agent llm needs --inference: 'embedded' or the URL of an inference server")
        if self.samples < 1 or self.concurrency < 1:
            raise ConfigError("--samples and --concurrency must be at least 1")


def load_task_set(spec: str) -> list[Task]:
    """The tasks of ``spec`` (``builtin`` or a path); loading problems are a ConfigError listing them."""
    if spec == "builtin":
        from sandrl.tasks.builtin import SUITE_DIR

        path = SUITE_DIR
    else:
        path = Path(spec)
    tasks, problems = load_tasks(path)
    if problems:
        listed = "\n".join(f"  {p.problem}" for p in problems[:10])
        raise ConfigError(f"{len(problems)} task(s) under {path} did not load:\n{listed}")
    if not tasks:
        raise ConfigError(f"no tasks under {path}: give a task directory, a directory of them, or 'builtin'")
    return tasks


def _tokenizer(model: str, policy: InferenceClient) -> Tokenizer:
    own = getattr(policy, "tokenizer", None)  # the embedded engine has its own
    if isinstance(own, Tokenizer):
        return own
    if model == "tiny":
        return ByteTokenizer()
    tokenizer = load_tokenizer(model)
    if tokenizer is None:
        raise ConfigError(f"no tokenizer files in {model}: --model must name the served checkpoint's directory")
    return tokenizer


@contextlib.asynccontextmanager
async def open_policy(inference: str | None, model: str) -> AsyncIterator[InferenceClient | None]:
    """The policy named by ``--inference``: None, the embedded engine, or an SGLang-routes client."""
    if inference is None:
        yield None
    elif inference == "embedded":
        from sandrl.inference.engine import Engine

        engine = Engine.load(model)
        try:
            yield engine
        finally:
            await engine.aclose()
    else:
        from sandrl.inference.sglang import SGLangClient

        async with SGLangClient(inference) as client:
            await client.health()
            yield client


def make_agent(config: EvalConfig, policy: InferenceClient | None) -> Agent:
    if config.agent == "oracle":
        return OracleAgent()
    if config.agent == "null":
        return NullAgent()
    if config.agent == "replay":
        low, high = config.think_s
        return ReplayAgent(list(config.replay), ThinkTime(round(low * 100), round(high * 100), 100.0))
    assert policy is not None
    sampling = SamplingParams(temperature=config.temperature, max_new_tokens=config.max_new_tokens)
    return LLMAgent(
        _tokenizer(config.model, policy), LLMAgentConfig(sampling=sampling, system_prompt=config.system_prompt)
    )


async def evaluate(
    config: EvalConfig,
    *,
    provider: SandboxProvider | None = None,
    progress: bool = True,
    console: Console | None = None,
) -> RunResult:
    """Run the evaluation; print the summary; return every group and the summary."""
    tasks = load_task_set(config.tasks)
    if provider is None:
        from sandrl.sandbox.bwrap import BwrapProvider

        provider = BwrapProvider()
    writer = TrajectoryWriter(config.out) if config.out is not None else None
    try:
        async with open_policy(config.inference if config.agent == "llm" else None, config.model) as policy:
            # A conversation longer than the model's context cannot be generated from: the token
            # budget ends the episode as truncated there instead of failing the next turn.
            context = getattr(policy, "max_context", None)
            max_total = min(config.max_total_tokens, context) if isinstance(context, int) else config.max_total_tokens
            budget = Budget(max_turns=config.max_turns, max_total_tokens=max_total)
            runner_config = RunnerConfig(
                concurrency=config.concurrency,
                group_size=config.samples,
                max_attempts=config.max_attempts,
                host_capacity=config.host_capacity,
                run_id=config.run_id,
                episode=EpisodeConfig(budget=budget),
            )
            agent = make_agent(config, policy)
            runner = RolloutRunner(provider, agent, policy=policy, config=runner_config, writer=writer)
            result = await runner.run(tasks, progress=progress)
    finally:
        if writer is not None:
            writer.close()
    print_summary(result.summary, console)
    return result


def result_line(config: EvalConfig, result: RunResult) -> dict[str, Any]:
    """The JSON line ``sandrl eval`` ends with."""
    return {
        "eval": config.tasks,
        "agent": config.agent,
        "samples": config.samples,
        "wall_s": round(result.wall_s, 3),
        "out": str(config.out) if config.out is not None else None,
        **result.summary,
    }
