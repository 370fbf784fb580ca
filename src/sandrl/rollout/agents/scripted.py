"""Scripted agents: the oracle, the null agent, and the replay and long-tail agents of the benchmarks.

- :class:`OracleAgent` runs the task's reference solution: a sound task then scores 1.
- :class:`NullAgent` does nothing: a sound task then scores 0.
- :class:`ReplayAgent` replays a fixed list of commands, sleeping an emulated model time before
  each (:class:`ThinkTime`: a token count drawn per turn, at a tokens/s rate), so the sandbox
  side of an episode can be measured with the model's time held fixed.
- :class:`LongTailAgent` samples a few tokens from the policy, then runs one ``sleep`` of a
  long-tailed length (:class:`CommandTimes`): the training benchmark's agent, whose episodes
  carry a weight version and a reward without a model that can solve anything.
"""

from __future__ import annotations

import asyncio
import collections
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sandrl.errors import ConfigError
from sandrl.inference.base import InferenceClient, SamplingParams
from sandrl.inference.tokenizer import ByteTokenizer
from sandrl.rollout.agent import AgentResult, Budget, Deadline
from sandrl.rollout.trajectory import Turn
from sandrl.sandbox.base import Sandbox
from sandrl.tasks.task import Task
from sandrl.tasks.verify import run_solution

SOLUTION = "@solution"
"""In a replay list, stands for the task's reference solution."""

DEFAULT_REPLAY: tuple[str, ...] = ("ls -la", SOLUTION)
"""The replay agent's commands when none are given: look, then solve."""


class OracleAgent:
    """Runs the task's solution as one turn, within the agent's wall-time budget."""

    name = "oracle"

    async def run(self, task: Task, sandbox: Sandbox, policy: InferenceClient | None, budget: Budget) -> AgentResult:
        if task.solution is None:
            return AgentResult("error", error=f"task {task.id} has no reference solution for the oracle to run")
        started = time.monotonic()
        result = await run_solution(task, sandbox)
        turn = Turn(
            index=0,
            command=task.solution.command,
            exit_code=result.exit_code,
            timed_out=result.timed_out,
            output_truncated=result.truncated,
            command_s=result.duration_s,
            sandbox_wait_s=time.monotonic() - started,
        )
        return AgentResult("wall_time" if result.timed_out else "done", [turn])


class NullAgent:
    """Does nothing; the verifier judges the untouched environment."""

    name = "null"

    async def run(self, task: Task, sandbox: Sandbox, policy: InferenceClient | None, budget: Budget) -> AgentResult:
        return AgentResult("done")


@dataclass(frozen=True)
class ThinkTime:
    """Emulated model time per turn: ``tokens / tokens_per_s`` with ``tokens`` uniform in [min, max]."""

    min_tokens: int = 100
    max_tokens: int = 200
    tokens_per_s: float = 100.0
    """Decode speed of the emulated server, per request."""

    def __post_init__(self) -> None:
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ConfigError(
                f"think time needs 0 <= min_tokens <= max_tokens, got {self.min_tokens}, {self.max_tokens}"
            )
        if self.tokens_per_s <= 0:
            raise ConfigError(f"tokens_per_s must be positive, got {self.tokens_per_s}")

    def sample(self, rng: random.Random) -> float:
        return rng.randint(self.min_tokens, self.max_tokens) / self.tokens_per_s


Commands = Sequence[str] | Callable[[Task], Sequence[str]]
"""A fixed list, or one per task; :data:`SOLUTION` in it runs the task's reference solution."""


class ReplayAgent:
    """Replays commands with an emulated think time before each; see the module docstring."""

    name = "replay"

    def __init__(
        self,
        commands: Commands,
        think: ThinkTime | None = None,
        *,
        seed: int = 0,
        command_timeout_s: float = 60.0,
    ) -> None:
        self.commands = commands
        self.think = think or ThinkTime()
        self.command_timeout_s = command_timeout_s
        self._rng = random.Random(seed)

    def commands_for(self, task: Task) -> list[str]:
        return list(self.commands(task) if callable(self.commands) else self.commands)

    async def run(self, task: Task, sandbox: Sandbox, policy: InferenceClient | None, budget: Budget) -> AgentResult:
        deadline = Deadline(budget.wall_time_for(task))
        turns: list[Turn] = []
        commands = self.commands_for(task)
        for index, command in enumerate(commands):
            if index >= budget.max_turns:
                return AgentResult("max_turns", turns)
            think_s = self.think.sample(self._rng)
            if think_s >= deadline.remaining():
                await asyncio.sleep(deadline.remaining())
                return AgentResult("wall_time", turns)
            started = time.monotonic()
            await asyncio.sleep(think_s)
            model_s = time.monotonic() - started
            timeout = min(self.command_timeout_s, deadline.remaining())
            waited = time.monotonic()
            if command == SOLUTION:
                result = await run_solution(task, sandbox)
                shown = task.solution.command if task.solution is not None else command
            else:
                result = await sandbox.exec(command, timeout_s=timeout, cwd=task.environment.workdir)
                shown = command
            turns.append(
                Turn(
                    index=index,
                    command=shown,
                    exit_code=result.exit_code,
                    timed_out=result.timed_out,
                    output_truncated=result.truncated,
                    model_s=model_s,
                    command_s=result.duration_s,
                    sandbox_wait_s=time.monotonic() - waited,
                )
            )
            if deadline.expired and index < len(commands) - 1:
                return AgentResult("wall_time", turns)
        return AgentResult("done", turns)


@dataclass(frozen=True)
class CommandTimes:
    """A seeded lognormal of command seconds: ``median_s x exp(sigma x N(0, 1))``, at most ``cap_s``."""

    median_s: float = 0.8
    sigma: float = 1.2
    """1.2: the slowest of 8 commands (one sync batch) takes ~6x the median, ~3x the mean."""
    cap_s: float = 20.0
    """Well inside the generated tasks' agent timeout (60 s)."""
    seed: int = 0

    def __post_init__(self) -> None:
        if not (self.median_s > 0 and self.sigma >= 0 and self.cap_s >= self.median_s):
            raise ConfigError(
                f"command times need median_s > 0, sigma >= 0 and cap_s >= median_s; got {self.median_s}, "
                f"{self.sigma}, {self.cap_s}"
            )

    def draw(self, key: str) -> float:
        """The command time of ``key`` (same key, same time)."""
        # The prefix names where the draws were first made: kept, so the same seed draws the same times.
        rng = random.Random(f"sandrl.bench.train:{self.seed}:{key}")
        return min(self.cap_s, rng.lognormvariate(math.log(self.median_s), self.sigma))

    @property
    def mean_s(self) -> float:
        """The uncapped mean, ``median_s x exp(sigma^2 / 2)``."""
        return self.median_s * math.exp(self.sigma**2 / 2)


class LongTailAgent:
    """One model turn of ``tokens`` tokens, then ``sleep`` for a drawn time; an even first token solves.

    The k-th episode this agent runs on a task draws key ``<task id>/<k>``, so two runs over the
    same tasks in the same order see the same command times whatever their concurrency.
    """

    name = "longtail"

    def __init__(self, times: CommandTimes, tokens: int = 4) -> None:
        self.times = times
        self.tokens = tokens
        self.tokenizer = ByteTokenizer()
        self._seen: collections.Counter[str] = collections.Counter()

    async def run(self, task: Task, sandbox: Sandbox, policy: InferenceClient | None, budget: Budget) -> AgentResult:
        if policy is None:
            return AgentResult("error", error="the long-tail agent samples from a policy; none was given")
        key = f"{task.id}/{self._seen[task.id]}"
        self._seen[task.id] += 1
        prompt = self.tokenizer.encode_messages([{"role": "user", "content": "go"}], add_generation_prompt=True)
        started = time.monotonic()
        gen = await policy.generate(prompt, SamplingParams(max_new_tokens=self.tokens, ignore_eos=True))
        model_s = time.monotonic() - started
        command = f"sleep {self.times.draw(key):.3f}"
        started = time.monotonic()
        result = await sandbox.exec(command, timeout_s=self.times.cap_s + 30, cwd=task.environment.workdir)
        if gen.output_ids and gen.output_ids[0] % 2 == 0:
            await run_solution(task, sandbox)
            command += " && solve"
        turn = Turn(
            index=0,
            command=command,
            output_start=len(prompt),
            output_end=len(prompt) + len(gen.output_ids),
            context_tokens=len(prompt),
            finish_reason=gen.finish_reason,
            weight_version=gen.weight_version,
            start_weight_version=gen.start_weight_version,
            output_weight_versions=gen.output_weight_versions,
            exit_code=result.exit_code,
            timed_out=result.timed_out,
            model_s=model_s,
            command_s=result.duration_s,
            sandbox_wait_s=time.monotonic() - started,
        )
        return AgentResult(
            "done",
            [turn],
            ids=[*prompt, *gen.output_ids],
            loss_mask=[0] * len(prompt) + [1] * len(gen.output_ids),
            logprobs=[0.0] * len(prompt) + list(gen.output_logprobs),
            prompt_len=len(prompt),
        )
