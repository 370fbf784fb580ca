"""A multi-step task's step setup, as Harbor runs it just before the step's agent: the previous step's
tests and verifier output emptied, the step's ``workdir/`` copied into the working directory, its
``setup.sh`` run there, then its healthcheck polled (:func:`check_step`, Docker's ``HEALTHCHECK`` rules).

A setup or healthcheck that fails raises :class:`~sandrl.errors.TaskError` with ``error_code``
:data:`STEP_SETUP_FAILED`. Before the first step nothing an agent did can be the cause: the task is
broken (an infra error). Before a later step it may be what the agent left (Harbor's cookbook task
checks that the previous step's script is there), so the episode scores that step 0 and stops:
Harbor leaves such a step out of the roll-up and retries the trial, which would let a policy skip a
step it would fail by breaking what the step's setup needs (:mod:`sandrl.rollout.multi_step`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from sandrl.errors import TaskError
from sandrl.sandbox.base import Sandbox
from sandrl.tasks.sandbox_io import empty_dir_command, extract_tar, run, tar_path
from sandrl.tasks.task import TESTS_DIR, VERIFIER_LOGS_DIR, Healthcheck, Task

STEP_SETUP_FAILED = "step_setup_failed"
"""The ``error_code`` of a step whose ``setup.sh`` or healthcheck failed."""
SETUP_TIMEOUT_S = 600.0
"""A step's ``setup.sh`` (Harbor gives it no limit of its own)."""


def _failed(task: Task, name: str, what: str) -> TaskError:
    return TaskError(f"task {task.id}: step {name}'s {what}", error_code=STEP_SETUP_FAILED)


async def prepare_step(task: Task, index: int, sandbox: Sandbox) -> None:
    """Step ``index``'s files and ``setup.sh``, after the previous step's tests are emptied; TaskError when
    ``setup.sh`` fails."""
    step = task.steps[index]
    workdir = task.environment.workdir
    if index > 0:
        # The previous step's tests and what its verifier wrote go before anything of this step runs
        # (Harbor resets them too): an agent never sees a verifier's files.
        await run(
            sandbox,
            f"{empty_dir_command(TESTS_DIR)} && {empty_dir_command(VERIFIER_LOGS_DIR)}",
            what="clearing the previous step's tests",
        )
    if step.workdir_files is not None:
        await extract_tar(sandbox, tar_path(step.workdir_files), workdir, replace=False)
        if (step.workdir_files / "setup.sh").is_file():
            done = await sandbox.exec(["bash", "./setup.sh"], cwd=workdir, timeout_s=SETUP_TIMEOUT_S)
            if done.exit_code != 0:
                output = (done.stderr or done.stdout).strip()[-500:]
                raise _failed(task, step.name, f"workdir/setup.sh failed (exit {done.exit_code}): {output}")


async def check_step(task: Task, index: int, sandbox: Sandbox) -> None:
    """Step ``index``'s healthcheck, when it has one; TaskError when it fails."""
    step = task.steps[index]
    if step.healthcheck is not None:
        check = step.healthcheck
        await run_healthcheck(
            check, sandbox, cwd=task.environment.workdir, failed=lambda w: _failed(task, step.name, w)
        )


async def run_healthcheck(
    check: Healthcheck, sandbox: Sandbox, *, cwd: str, failed: Callable[[str], Exception]
) -> None:
    """Poll ``check`` until it passes; ``failed(what)`` makes the error raised when it does not (Docker's
    ``HEALTHCHECK`` rules: failures within the start period do not count, ``retries`` in a row after it do)."""
    start_period_end = time.monotonic() + check.start_period_s
    failures = 0
    while True:
        in_start_period = time.monotonic() < start_period_end
        result = await sandbox.exec(check.command, timeout_s=check.timeout_s, cwd=cwd)
        if result.exit_code == 0:
            return
        if in_start_period:
            await asyncio.sleep(check.start_interval_s)
            continue
        failures += 1
        if failures >= check.retries:
            output = (result.stderr or result.stdout).strip()[-300:]
            raise failed(
                f"healthcheck failed {failures} times in a row (exit {result.exit_code}): {check.command}"
                + (f": {output}" if output else "")
            )
        await asyncio.sleep(check.interval_s)
