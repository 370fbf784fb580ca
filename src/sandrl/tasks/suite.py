"""Tasks run for real: the environment built, an oracle or a null agent, the real verifier.

``run_task`` is one episode without a policy: build the task's image
(the provider's ``resolve_image``), start a sandbox from it, set up the environment,
run the reference solution (``oracle``) or nothing (``null``), verify. ``validate_task`` checks a
task is sound: its environment builds, its tests fail untouched and pass after the oracle.
``run_many`` runs either over a task set with bounded concurrency. These back ``sandrl tasks run``
and ``sandrl tasks validate``; the training path uses :mod:`sandrl.rollout` instead.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

from sandrl.aio import gather_all
from sandrl.errors import SandrlError
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.tasks.result import VerifyResult
from sandrl.tasks.task import Task
from sandrl.tasks.verify import prepare_environment, run_solution, verify

AgentKind = Literal["oracle", "null"]
T = TypeVar("T")


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


def _verify_error(result: VerifyResult) -> str | None:
    if result.error is None:
        return None
    tail = result.stdout_tail.strip().splitlines()[-5:]
    return result.error + (": " + " | ".join(tail) if tail else "")


async def _episode(
    task: Task, provider: BwrapProvider, image: str, agent: AgentKind
) -> tuple[VerifyResult, int | None]:
    solution_exit: int | None = None
    async with await provider.create(task.to_sandbox_spec(image=image)) as sandbox:
        await prepare_environment(task, sandbox)
        if agent == "oracle":
            solution_exit = (await run_solution(task, sandbox)).exit_code
        result = await verify(task, sandbox)
    return result, solution_exit


async def run_task(task: Task, provider: BwrapProvider, agent: AgentKind) -> TaskRun:
    """Run ``task`` with the oracle or the null agent; errors are recorded on the result, not raised."""
    start = time.monotonic()
    image: str | None = None
    build_s = 0.0
    try:
        image = await provider.resolve_image(task.image_source())
        build_s = time.monotonic() - start
        result, solution_exit = await _episode(task, provider, image, agent)
    except SandrlError as exc:
        return TaskRun(task.id, agent, 0.0, False, image, build_s, time.monotonic() - start, error=str(exc))
    return TaskRun(
        task.id,
        agent,
        result.reward,
        result.passed,
        image,
        build_s,
        time.monotonic() - start,
        error=_verify_error(result),
        solution_exit_code=solution_exit,
        verify_exit_code=result.exit_code,
    )


async def validate_task(task: Task, provider: BwrapProvider) -> TaskValidation:
    """Build the environment; the tests must fail without the solution and pass with it."""
    start = time.monotonic()
    if task.solution is None:
        return TaskValidation(task.id, False, None, None, 0.0, problem="the task has no reference solution")
    try:
        image = await provider.resolve_image(task.image_source())
    except SandrlError as exc:
        return TaskValidation(task.id, False, None, None, time.monotonic() - start, problem=str(exc))
    try:
        (without, _), (with_, solution_exit) = await gather_all(
            _episode(task, provider, image, "null"), _episode(task, provider, image, "oracle")
        )
    except SandrlError as exc:
        return TaskValidation(task.id, True, None, None, time.monotonic() - start, problem=str(exc))
    problem = None
    if without.error is not None or with_.error is not None:
        problem = f"the verifier is broken: {_verify_error(without) or _verify_error(with_)}"
    elif without.passed or without.reward >= 1.0:
        problem = f"the tests pass without the solution (reward {without.reward:g}): they check nothing the agent does"
    elif not with_.passed:
        problem = (
            f"the tests fail after the solution (reward {with_.reward:g}, solve.sh exit {solution_exit}): "
            + " | ".join(with_.stdout_tail.strip().splitlines()[-5:])
        )
    return TaskValidation(task.id, True, without.reward, with_.reward, time.monotonic() - start, problem)


async def run_many(
    tasks: Sequence[Task],
    work: Callable[[Task], Awaitable[T]],
    *,
    concurrency: int,
    on_done: Callable[[Task, T], None] | None = None,
) -> list[T]:
    """``work`` on every task, at most ``concurrency`` at once; results in the tasks' order."""
    semaphore = asyncio.Semaphore(max(1, concurrency))

    async def one(task: Task) -> T:
        async with semaphore:
            result = await work(task)
        if on_done is not None:
            on_done(task, result)
        return result

    return await gather_all(*(one(task) for task in tasks))
