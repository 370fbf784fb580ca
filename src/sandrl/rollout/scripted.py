"""Agents without a model: the oracle, the null agent, and the replay agent of the benchmarks.

- :class:`OracleAgent` runs the task's reference solution: a sound task then scores 1.
- :class:`NullAgent` does nothing: a sound task then scores 0.
- :class:`ReplayAgent` replays a fixed list of commands, sleeping an emulated model time before
  each (:class:`ThinkTime`: a token count drawn per turn, at a tokens/s rate), so the sandbox
  side of an episode can be measured with the model's time held fixed.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sandrl.errors import ConfigError
from sandrl.inference.base import InferenceClient
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
