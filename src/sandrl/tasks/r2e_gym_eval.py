"""R2E-Gym in a sandbox: its hidden tests taken out before the agent, put back and run after it.

**Setup** (R2E-Gym's ``DockerRuntime.setup_env`` moves ``run_tests.sh`` and ``r2e_tests`` out of
``/testbed``, to ``/root``): the image's repository must be at the fix's parent; then the tests
leave the sandbox altogether. A tar of ``/r2e_tests`` (stale bytecode removed, as R2E-Gym does) and
``run_tests.sh`` is kept on the host, the same for every sandbox of one image, and both are removed
from the sandbox: the agent can neither read nor change them, as with every other task's tests.

**Grading** (``_calculate_reward_r2e``): the tests are written back, fresh, to
``/testbed/r2e_tests``; ``run_tests.sh`` runs in ``/testbed``; its pytest summary is read as
R2E-Gym's ``parse_log_pytest`` reads it: each ``PASSED`` / ``FAILED`` / ``ERROR`` line gives its
test's status, the test named by the id after its file (``TestClass.test_name``), a `` - message``
dropped. Reward 1 when exactly the expected tests were reported, each with its expected status
(an expected ``FAILED`` included); else 0.

Stricter than R2E-Gym: only the last "short test summary info" section is read (a test that prints
one earlier changes nothing), and a line's status is its first word rather than any status word
in it. The printed summary is what every R2E-Gym image gives (its tornado images run a unittest
runner that prints pytest's summary), so it is read rather than a JUnit report.
"""

from __future__ import annotations

import functools
import posixpath
import re
import shlex
import time
import zlib

from sandrl.errors import SandboxFileError, TaskError
from sandrl.sandbox.base import Sandbox
from sandrl.tasks.envvars import resolve_env
from sandrl.tasks.r2e_gym import STATUSES, test_key
from sandrl.tasks.result import VerifyResult, result_since
from sandrl.tasks.sandbox_io import empty_dir_command, extract_tar, read_optional, run, run_logged
from sandrl.tasks.task import R2eGymInstance, Task

WORK_DIR = "/tmp/sandrl-r2e"
"""The tests, their log and the setup's archive live here, outside the repository."""
TESTS_MAX_BYTES = 16 << 20
"""Largest archive of an image's tests kept on the host (R2E-Gym's are a few test files)."""
LOG_MAX_BYTES = 64 << 20
"""Most bytes of the test log read: the summary, one line a test, is at its end."""
SHOWN = 50
"""Tests named in a result's details, per kind of mismatch."""

_captured: dict[str, bytes] = {}
"""Task key → the archive of its image's tests, taken at setup in this process (see the module);
compressed, as a run may hold thousands."""
_HEADER = re.compile(r"^=+\s*short test summary info\s*=+\s*$", re.IGNORECASE | re.MULTILINE)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _instance(task: Task) -> R2eGymInstance:
    if task.r2e_gym is None:
        raise TaskError(f"task {task.id} is not an R2E-Gym instance")
    return task.r2e_gym


async def setup_repository(task: Task, sandbox: Sandbox) -> None:
    """Check the image is this instance's, and take its tests out of the sandbox (kept on the host)."""
    instance = _instance(task)
    head = await sandbox.exec(["git", "rev-parse", "HEAD"], cwd=instance.repo_dir, timeout_s=60.0)
    if head.exit_code != 0 or head.stdout.strip() != instance.old_commit:
        said = " ".join((head.stderr or head.stdout).split())[-300:]
        raise TaskError(
            f"task {task.id}: the image {task.environment.docker_image} has no repository at commit "
            f"{instance.old_commit} in {instance.repo_dir} ({said}); is it R2E-Gym's image of this instance?"
        )
    tests, script = instance.tests_dir, instance.run_tests
    archive = f"{WORK_DIR}/tests.tar"
    take = (
        f"{empty_dir_command(WORK_DIR)} && "
        f"find {shlex.quote(tests)} \\( -name '*.pyc' -o -name __pycache__ \\) -prune -exec rm -rf {{}} + && "
        f"tar -cf {archive} -C {shlex.quote(posixpath.dirname(tests))} {shlex.quote(posixpath.basename(tests))} "
        f"-C {shlex.quote(posixpath.dirname(script))} {shlex.quote(posixpath.basename(script))}"
    )
    taken = await sandbox.exec(take, cwd="/", timeout_s=120.0)
    if taken.exit_code != 0:
        said = " ".join((taken.stderr or taken.stdout).split())[-300:]
        raise TaskError(
            f"task {task.id}: the image {task.environment.docker_image} has no tests at {tests} and {script} "
            f"({said}); is it R2E-Gym's image of this instance?"
        )
    try:
        data = await sandbox.read_file(archive, max_bytes=TESTS_MAX_BYTES)
    except SandboxFileError as exc:
        raise TaskError(f"task {task.id}: its image's tests cannot be kept: {exc}") from exc
    await run(sandbox, f"rm -rf {shlex.quote(tests)} {shlex.quote(script)} {WORK_DIR}", what="removing the tests")
    _captured[task.key] = zlib.compress(data)


def summary_statuses(log: str) -> dict[str, str] | None:
    """Test name → status from the last pytest summary section of ``log`` (see the module); None without one."""
    text = _ANSI.sub("", log).replace("\r", "")
    headers = list(_HEADER.finditer(text))
    if not headers:
        return None
    statuses: dict[str, str] = {}
    for line in text[headers[-1].end() :].splitlines():
        if line.startswith("="):
            break  # "=== 3 passed in 0.1s ===" closes the section
        status, _, rest = line.strip().partition(" ")
        if status in STATUSES:
            statuses[test_key(".".join(rest.split("::")[1:]))] = status
    return statuses


def _compare(expected: dict[str, str], got: dict[str, str]) -> dict[str, object]:
    wrong = {
        name: {"expected": status, "got": got[name]}
        for name, status in expected.items()
        if got.get(name, status) != status
    }
    missing = [name for name in expected if name not in got]
    unexpected = [name for name in got if name not in expected]
    return {
        "expected_tests": len(expected),
        "reported_tests": len(got),
        "wrong_status": dict(list(wrong.items())[:SHOWN]),
        "not_reported": missing[:SHOWN],
        "not_expected": unexpected[:SHOWN],
        "mismatches": len(wrong) + len(missing) + len(unexpected),
    }


async def grade(task: Task, sandbox: Sandbox) -> VerifyResult:
    """Run the image's tests on the sandbox as the agent left it, and compare every test's status."""
    instance = _instance(task)
    start = time.monotonic()

    result = functools.partial(result_since, start)

    tests = _captured.get(task.key)
    if tests is None:
        return result(
            error=f"task {task.id}: its sandbox was not set up in this process, so its tests are not here",
            infra_error=True,
        )
    await extract_tar(sandbox, zlib.decompress(tests), WORK_DIR, replace=True)
    name = posixpath.basename(instance.tests_dir)
    placed = posixpath.join(instance.repo_dir, name)
    # Where run_tests.sh looks for them; whatever the agent left at that path goes first.
    await run(
        sandbox,
        f"rm -rf {shlex.quote(placed)} && cp -a {WORK_DIR}/{shlex.quote(name)} {shlex.quote(placed)}",
        what="putting the tests back",
    )
    log = f"{WORK_DIR}/test-output.txt"
    env = resolve_env(task.verifier.env, where=f"task {task.id}: verifier env")
    script = f"{WORK_DIR}/{shlex.quote(posixpath.basename(instance.run_tests))}"
    tests_run, log_tail = await run_logged(
        sandbox, f"bash {script}", log=log, timeout_s=task.verifier.timeout_s, cwd=instance.repo_dir, env=env
    )
    if tests_run.timed_out:
        return result(
            error=f"the tests did not finish within {task.verifier.timeout_s:g} s",
            timed_out=True,
            output=log_tail,
            exit_code=tests_run.exit_code,
        )
    try:
        data = await read_optional(sandbox, log, max_bytes=LOG_MAX_BYTES)
    except SandboxFileError as exc:
        return result(error=f"the test log cannot be read: {exc}", output=log_tail, exit_code=tests_run.exit_code)
    statuses = summary_statuses(data.decode(errors="replace")) if data is not None else None
    if statuses is None:
        return result(
            error=f"the test run printed no pytest summary (exit {tests_run.exit_code}); its runner did not finish",
            infra_error=tests_run.exit_code in (126, 127),  # the runner itself is missing: the image's fault
            output=log_tail,
            exit_code=tests_run.exit_code,
        )
    details = _compare(dict(instance.expected), statuses)
    reward = 1.0 if details["mismatches"] == 0 else 0.0
    return result(reward, details=details, output=log_tail, exit_code=tests_run.exit_code)
