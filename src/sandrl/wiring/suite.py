"""Tasks run for real with the oracle or the null agent: ``sandrl tasks run`` and ``sandrl tasks validate``.

The episodes are the ones ``sandrl eval`` and training run (:func:`~sandrl.wiring.runner.build_runner`
with :class:`~sandrl.rollout.agents.scripted.OracleAgent` or :class:`~sandrl.rollout.agents.scripted.NullAgent`):
the task's image built, a sandbox from it, the environment set up, the agent, the real verifier,
each phase under its timeout, and a :class:`~sandrl.rollout.trajectory.Trajectory` recording
how it ended. A :class:`TaskRun` reports from it what ``sandrl eval`` records: the status, the
reward, and on a failure the verifier's exit code and the end of its output.

:func:`run_suite` runs one agent over a task set; :func:`validate_suite` checks every task is
sound: its environment builds, its tests fail untouched (null agent) and pass after the oracle.
There are no retries: an infra error is reported, not hidden.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from sandrl.aio import gather_all
from sandrl.rollout.agent import Agent
from sandrl.rollout.agents.scripted import NullAgent, OracleAgent
from sandrl.rollout.images import TaskImages
from sandrl.rollout.runner import RolloutRunner
from sandrl.rollout.summary import failure_reason, verifier_error, verifier_tail
from sandrl.rollout.trajectory import EpisodeStatus, Trajectory
from sandrl.sandbox.base import SandboxProvider
from sandrl.tasks.task import Task
from sandrl.wiring.config import RolloutConfig
from sandrl.wiring.runner import build_runner

AgentKind = Literal["oracle", "null"]


@dataclass(frozen=True)
class TaskRun:
    """One task run by the oracle or the null agent."""

    task_id: str
    agent: AgentKind
    reward: float
    passed: bool
    image: str | None
    build_s: float
    duration_s: float
    error: str | None = None
    """Why the run could not be judged (a build failure, a broken verifier, a sandbox error)."""
    solution_exit_code: int | None = None
    verify_exit_code: int | None = None
    status: EpisodeStatus = "completed"
    """How the episode ended, as ``sandrl eval`` counts it (completed, truncated, agent_error, infra_error)."""
    verify_output_tail: str | None = None
    """When the task did not pass: the last lines of the verifier's output (what the tests said)."""

    reason: str | None = None
    """Why the task did not pass, for people (:func:`~sandrl.rollout.summary.failure_reason`): the
    error, else the verifier's exit code and the last lines of its output."""

    def to_dict(self) -> dict[str, object]:
        return {
            "task": self.task_id,
            "agent": self.agent,
            "reward": self.reward,
            "passed": self.passed,
            "image": self.image,
            "build_s": round(self.build_s, 3),
            "duration_s": round(self.duration_s, 3),
            "error": self.error,
            "status": self.status,
            "solution_exit_code": self.solution_exit_code,
            "verify_exit_code": self.verify_exit_code,
            "verify_output_tail": self.verify_output_tail,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class TaskValidation:
    """Whether a task is sound: it builds, fails untouched, passes after its oracle."""

    task_id: str
    built: bool
    reward_without: float | None
    reward_with: float | None
    duration_s: float
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None


class _Images:
    """The runner's ``image_for``: each task's image built once, at most ``builds`` at once, timed."""

    def __init__(self, provider: SandboxProvider, builds: int) -> None:
        self._images = TaskImages(provider)
        self._builds = asyncio.Semaphore(builds)
        self.seconds: dict[str, float] = {}

    async def __call__(self, task: Task) -> str:
        start = time.monotonic()
        try:
            async with self._builds:
                return await self._images(task)
        finally:
            self.seconds.setdefault(task.key, time.monotonic() - start)


def _built(t: Trajectory) -> bool:
    return t.error is None or t.error.phase != "image"


def task_run(agent: AgentKind, t: Trajectory, build_s: float) -> TaskRun:
    """What ``sandrl tasks run`` reports of the episode ``t`` (whose image took ``build_s``)."""
    error = verifier_error(t.verifier) or (t.error.message if t.error is not None else None)
    return TaskRun(
        t.task_id,
        agent,
        t.reward or 0.0,
        bool(t.passed),
        t.image if _built(t) else None,
        build_s,
        build_s + t.timings.total_s,
        error=error,
        solution_exit_code=t.turns[0].exit_code if agent == "oracle" and t.turns else None,
        verify_exit_code=t.verifier.get("exit_code"),
        status=t.status,
        verify_output_tail=verifier_tail(t.verifier) if t.verifier and not t.passed else None,
        reason=failure_reason(t),
    )


def _runner(
    provider: SandboxProvider,
    agent: Agent,
    images: _Images,
    concurrency: int,
    on_episode: Callable[[Trajectory], None],
    run_id: str,
) -> RolloutRunner:
    rollout = RolloutConfig(concurrency=concurrency, group_size=1, max_attempts=1, max_turns=1)
    return build_runner(rollout, provider, agent=agent, run_id=run_id, image_for=images, on_episode=on_episode)


async def run_suite(
    tasks: Sequence[Task],
    agent: AgentKind,
    provider: SandboxProvider,
    *,
    concurrency: int,
    on_done: Callable[[Task, TaskRun], None] | None = None,
) -> list[TaskRun]:
    """``agent`` on every task, ``concurrency`` episodes at once; results in the tasks' order.

    ``on_done`` is called as each task finishes. Errors are recorded on the results, not raised.
    """
    images = _Images(provider, concurrency)
    found: dict[str, TaskRun] = {}
    by_group: dict[str, Task] = {}

    def finished(t: Trajectory) -> None:
        task = by_group[t.group_id]
        found[t.group_id] = result = task_run(agent, t, images.seconds.get(task.key, 0.0))
        if on_done is not None:
            on_done(task, result)

    scripted = OracleAgent() if agent == "oracle" else NullAgent()
    runner = _runner(provider, scripted, images, concurrency, finished, f"tasks-run-{uuid.uuid4().hex[:8]}")
    by_group.update(zip(runner.group_ids(tasks), tasks, strict=True))
    await runner.run(tasks)
    return [found[group_id] for group_id in runner.group_ids(tasks)]


def _validation(task: Task, null: Trajectory, oracle: Trajectory, build_s: float) -> TaskValidation:
    seconds = build_s + max(null.timings.total_s, oracle.timings.total_s)
    without, with_ = null.reward, oracle.reward
    for t in (null, oracle):
        if not _built(t):
            assert t.error is not None
            return TaskValidation(task.id, False, None, None, seconds, problem=t.error.message)
    broken = verifier_error(null.verifier) or verifier_error(oracle.verifier)
    problem = None
    if broken is not None:
        problem = f"the verifier is broken: {broken}"
    elif null.error is not None:
        problem = null.error.message
    elif oracle.error is not None:
        problem = oracle.error.message
    elif null.passed or (without or 0.0) >= 1.0:
        problem = f"the tests pass without the solution (reward {without:g}): they check nothing the agent does"
    elif not oracle.passed:
        solution_exit = oracle.turns[0].exit_code if oracle.turns else None
        problem = (
            f"the tests fail after the solution (reward {with_ or 0.0:g}, solve.sh exit {solution_exit}): "
            + verifier_tail(oracle.verifier)
        )
    return TaskValidation(task.id, True, without, with_, seconds, problem)


async def validate_suite(
    tasks: Sequence[Task],
    provider: SandboxProvider,
    *,
    concurrency: int,
    on_done: Callable[[Task, TaskValidation], None] | None = None,
) -> list[TaskValidation]:
    """Every task: the environment builds, the tests fail without the solution and pass with it.

    The null and the oracle episodes of a task run side by side (two sandboxes), ``concurrency``
    tasks at once; results in the tasks' order.
    """
    found: dict[str, TaskValidation] = {}
    for task in tasks:
        if task.solution is None:
            found[task.key] = TaskValidation(task.id, False, None, None, 0.0, "the task has no reference solution")
            if on_done is not None:
                on_done(task, found[task.key])
    runnable = [t for t in tasks if t.key not in found]
    images = _Images(provider, concurrency)
    by_group: dict[str, Task] = {}
    halves: dict[str, dict[str, Trajectory]] = {}

    def finished(t: Trajectory) -> None:
        task = by_group[t.group_id]
        pair = halves.setdefault(t.group_id, {})
        pair[t.agent] = t
        if len(pair) == 2:
            build_s = images.seconds.get(task.key, 0.0)
            found[task.key] = result = _validation(task, pair["null"], pair["oracle"], build_s)
            if on_done is not None:
                on_done(task, result)

    # One run id for both runners: a task's two episodes meet under its group id.
    run_id = f"tasks-validate-{uuid.uuid4().hex[:8]}"
    null = _runner(provider, NullAgent(), images, concurrency, finished, run_id)
    oracle = _runner(provider, OracleAgent(), images, concurrency, finished, run_id)
    by_group.update(zip(null.group_ids(runnable), runnable, strict=True))
    await gather_all(null.run(runnable), oracle.run(runnable))
    return [found[task.key] for task in tasks]
