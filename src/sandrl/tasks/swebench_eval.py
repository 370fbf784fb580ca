"""SWE-bench in a sandbox: check the repository out, and grade a patch as the SWE-bench harness does.

Grading follows ``swebench.harness``: the model's patch is applied to the repository at
``base_commit`` with the harness's fallbacks (``git apply --verbose``, ``git apply --verbose
--reject``, ``patch --batch --fuzz=5 -p1 -i``); the files the test patch touches are reset to
``base_commit`` and the test patch applied; the tests run; the instance is resolved when every
FAIL_TO_PASS and every PASS_TO_PASS test passed (an expected failure counts as a pass).

In SWE-bench's published image the repository is already at ``/testbed`` and the tests run in
its conda environment, with the harness's test command for the repository and version
(:mod:`sandrl.tasks.swebench_specs` says which parts follow the harness exactly); from a local
clone the repository is checked out here first and the tests run in the sandbox's own Python.

Where this differs, it is stricter: pytest's results come from its JUnit XML report, not from the
printed log, so no test output can fake a result (Django's and SymPy's runners have no such
report: their logs are read with the harness's parsers, :mod:`sandrl.tasks.swebench_logs`); a
skipped FAIL_TO_PASS or PASS_TO_PASS test is a failure (SWE-bench leaves it out of the count); and
the repository is reset between two patch attempts so that a half-applied ``--reject`` leaves
nothing behind.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import os
import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from sandrl.cache_dirs import cache_dir as sandrl_cache_dir
from sandrl.errors import SandboxFileError, TaskError
from sandrl.sandbox.base import Sandbox
from sandrl.tasks import swe_smith
from sandrl.tasks.envvars import resolve_env
from sandrl.tasks.pytest_results import JunitError, TestStatus, parse_junit_xml, status_of
from sandrl.tasks.result import VerifyResult, result_since
from sandrl.tasks.sandbox_io import empty_dir_command, extract_tar, read_optional, run, run_logged
from sandrl.tasks.swebench_logs import parse_django_log, parse_sympy_log
from sandrl.tasks.task import SweBenchInstance, Task

GIT_APPLY_COMMANDS = ("git apply --verbose", "git apply --verbose --reject", "patch --batch --fuzz=5 -p1 -i")
"""SWE-bench's patch commands, tried in this order."""
WORK_DIR = "/tmp/sandrl-swebench"
"""Patches, the test log and the JUnit report live here, outside the repository."""
JUNIT_PLACEHOLDER = "{junit_xml}"
PATCH_MAX_BYTES = 8 << 20
"""Largest model patch graded (it is kept in the trajectory's verifier details); SWE-bench fixes are KBs."""
JUNIT_MAX_BYTES = 64 << 20
"""Most bytes of the JUnit report read; large test suites write a few MB."""


def _instance(task: Task) -> SweBenchInstance:
    if task.swebench is None:
        raise TaskError(f"task {task.id} is not a SWE-bench instance")
    return task.swebench


# --- the repository --------------------------------------------------------------------------


def cache_dir() -> Path:
    """Where repository snapshots are kept: ``$SANDRL_CACHE_DIR/swebench`` or ``~/.cache/sandrl/swebench``."""
    return sandrl_cache_dir("swebench")


def _git(*args: str, cwd: Path | None = None) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise TaskError(f"git {' '.join(args)} failed: {done.stderr.strip()[-500:]}")
    return done.stdout.strip()


def repository_snapshot(source: Path, commit: str) -> Path:
    """A tar of ``source`` checked out at ``commit``, with the history up to it and nothing after.

    A plain clone would carry the later commits, and with them the fix: the agent could find it
    with ``git log --all``. So the snapshot is a fresh repository that fetched only ``commit``.
    Snapshots are cached by source and commit; writing is atomic, so concurrent builds are safe.
    """
    sha = _git("-C", str(source), "rev-parse", "--verify", f"{commit}^{{commit}}")
    key = hashlib.sha256(str(source.resolve()).encode()).hexdigest()[:16]
    target = cache_dir() / f"{source.name}-{key}-{sha}.tar"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sandrl-repo-") as tmp:
        repo = Path(tmp) / "repo"
        _git("-c", "init.defaultBranch=main", "init", "-q", str(repo))
        _git("fetch", "-q", "--no-tags", str(source.resolve()), sha, cwd=repo)
        _git("checkout", "-q", "-B", "main", sha, cwd=repo)
        # So that an agent can commit without configuring git first.
        _git("config", "user.email", "agent@sandrl.invalid", cwd=repo)
        _git("config", "user.name", "sandrl agent", cwd=repo)
        (repo / ".git" / "FETCH_HEAD").unlink(missing_ok=True)
        partial = target.with_suffix(f".{os.getpid()}.partial")
        subprocess.run(["tar", "-cf", str(partial), "-C", str(repo), "."], check=True, capture_output=True)
        partial.replace(target)
    return target


async def setup_repository(task: Task, sandbox: Sandbox) -> None:
    """Put the repository at ``base_commit`` into the sandbox at ``/testbed`` (from an image: check it
    is there; SWE-smith's: make it the bug's commit, :mod:`sandrl.tasks.swe_smith`)."""
    instance = _instance(task)
    if instance.bug_patch is not None:
        await swe_smith.setup_bug(task, instance, sandbox)
        return
    if instance.repo_source is None:
        base = f"{instance.base_commit}^{{commit}}"
        found = await sandbox.exec(["git", "cat-file", "-e", base], cwd=instance.repo_dir, timeout_s=60.0)
        if found.exit_code != 0:
            said = " ".join((found.stderr or found.stdout).split())[-300:]
            raise TaskError(
                f"task {task.id}: the image {task.environment.docker_image} has no repository with commit "
                f"{instance.base_commit} at {instance.repo_dir} ({said}); "
                "is it SWE-bench's image of this instance? Check swebench_images"
            )
        return
    snapshot = await asyncio.to_thread(repository_snapshot, instance.repo_source, instance.base_commit)
    data = await asyncio.to_thread(snapshot.read_bytes)
    await extract_tar(sandbox, data, instance.repo_dir, replace=True)


# --- grading ---------------------------------------------------------------------------------


# Compiled bytecode is never part of an answer, and a repository without a .gitignore would carry it.
_NOT_THE_ANSWER = ("':(exclude,glob)**/__pycache__/**'", "':(exclude,glob)**/*.pyc'")


async def model_patch(instance: SweBenchInstance, sandbox: Sandbox, dest: str) -> str | None:
    """Write the agent's work as a diff against ``base_commit`` (new files included) to ``dest``.

    Returns None when it succeeded, else why not. The diff goes to a file, not through the exec
    result, whose output cap a large diff would exceed.
    """
    result = await sandbox.exec(
        f"git add -A -- . {' '.join(_NOT_THE_ANSWER)} && "
        f"git diff --cached --binary {shlex.quote(instance.base_commit)} > {shlex.quote(dest)}",
        cwd=instance.repo_dir,
        timeout_s=300.0,
    )
    if result.exit_code != 0:
        return (result.stderr or result.stdout).strip()[-500:] or f"exit {result.exit_code}"
    return None


def _reset_command(instance: SweBenchInstance) -> str:
    # Ignored files stay: they are build artefacts of the environment, not the agent's answer.
    return f"git reset -q --hard {shlex.quote(instance.base_commit)} && git clean -fdq"


def _test_files_command(instance: SweBenchInstance) -> str:
    """Reset what the test patch touches to base_commit (SWE-bench's ``git checkout <base> <test files>``)."""
    base = shlex.quote(instance.base_commit)
    lines = []
    for name in instance.test_files:
        quoted = shlex.quote(name)
        lines.append(
            f"if git cat-file -e {base}:{quoted} 2>/dev/null; then git checkout -q {base} -- {quoted}; "
            f"else rm -rf -- {quoted}; fi"
        )
    return "\n".join(lines) or "true"


def eval_command(instance: SweBenchInstance, junit: str) -> str:
    """The shell command that runs the instance's tests: in an image, in bash inside its conda
    environment after the harness's ``eval_commands``; with a JUnit report at ``junit`` for pytest."""
    command = instance.test_command
    if instance.parser == "junit":
        if JUNIT_PLACEHOLDER in command:
            command = command.replace(JUNIT_PLACEHOLDER, shlex.quote(junit))
        else:
            command = f"{command} --junitxml={shlex.quote(junit)}"
    if not instance.test_prelude:
        return command
    # SWE-bench's eval script is bash (conda's activate, `source`); a sandbox's commands run in sh.
    script = f"{instance.test_prelude}\ncd {shlex.quote(instance.repo_dir)}\n{command}"
    return f"bash -c {shlex.quote(script)}"


def grade_statuses(
    instance: SweBenchInstance, status_of_test: Callable[[str], TestStatus | None]
) -> tuple[bool, dict[str, object]]:
    """Resolved or not, and the per-group lists SWE-bench's report has.

    ``status_of_test`` gives a test's status, None for one that did not run.
    """
    report: dict[str, object] = {}
    resolved = True
    for group, tests in (("FAIL_TO_PASS", instance.fail_to_pass), ("PASS_TO_PASS", instance.pass_to_pass)):
        success: list[str] = []
        failure: dict[str, str] = {}
        for test in tests:
            status = status_of_test(test)
            if status is not None and status.ok:
                success.append(test)
            else:
                failure[test] = "did not run" if status is None else status.value
        resolved = resolved and not failure
        report[group] = {"success": success, "failure": failure}
    return resolved, report


async def grade(task: Task, sandbox: Sandbox, *, patch: str | None = None) -> VerifyResult:
    """Grade the agent's changes to ``/testbed`` (or ``patch``, when given) as SWE-bench does."""
    instance = _instance(task)
    base = swe_smith.graded_base(task) if instance.bug_patch is not None else instance.base_commit
    instance = replace(instance, base_commit=base or "")
    start = time.monotonic()
    repo = instance.repo_dir

    result = functools.partial(result_since, start)

    if not base:
        return result(
            error=f"task {task.id}: its repository was not set up in this process, so the bug's commit is not known",
            infra_error=True,
        )
    await run(sandbox, empty_dir_command(WORK_DIR), what="making the grading directory")
    patch_file = f"{WORK_DIR}/model.patch"
    if patch is None:
        why = await model_patch(instance, sandbox, patch_file)
        if why is not None:
            return result(error=f"the agent's changes could not be read from {repo}: {why}")
        try:
            patch = (await sandbox.read_file(patch_file, max_bytes=PATCH_MAX_BYTES)).decode(errors="replace")
        except SandboxFileError as exc:
            return result(error=f"the agent's changes to {repo} could not be read as a patch: {exc}")
    else:
        if patch.strip() and not patch.endswith("\n"):
            patch += "\n"  # git apply rejects a final hunk line without its newline ("corrupt patch")
        await sandbox.write_file(patch_file, patch.encode())
    if not patch.strip():
        # As SWE-bench: an empty prediction is unresolved without running anything.
        return result(error="empty patch: nothing in the repository was changed")

    applied_with: str | None = None
    attempts: list[str] = []
    for command in GIT_APPLY_COMMANDS:
        await run(sandbox, _reset_command(instance), what="resetting the repository", cwd=repo)
        applied = await sandbox.exec(f"{command} {patch_file}", cwd=repo, timeout_s=300.0)
        attempts.append(f"$ {command}\n{applied.stdout}{applied.stderr}")
        if applied.exit_code == 0:
            applied_with = command
            break
    if applied_with is None:
        return result(
            error="the patch does not apply to base_commit with any of SWE-bench's commands",
            output="\n".join(attempts),
            details={"patch_applied": False, "model_patch": patch},
        )

    await run(sandbox, _test_files_command(instance), what="resetting the test files", cwd=repo)
    if instance.test_patch:  # SWE-smith's tests are the repository's own: nothing to add
        await sandbox.write_file(f"{WORK_DIR}/test.patch", instance.test_patch.encode())
        applied = await sandbox.exec(["git", "apply", "--verbose", f"{WORK_DIR}/test.patch"], cwd=repo, timeout_s=300.0)
        if applied.exit_code != 0:
            return result(
                error="the instance's test_patch does not apply after the model patch",
                output=applied.stdout + applied.stderr,
                infra_error=True,
            )

    junit = f"{WORK_DIR}/junit.xml"
    log = f"{WORK_DIR}/test-output.txt"
    env = resolve_env(task.verifier.env, where=f"task {task.id}: verifier env")
    tests, log_tail = await run_logged(
        sandbox,
        eval_command(instance, junit),
        log=log,
        timeout_s=task.verifier.timeout_s,
        cwd=repo,
        env=env,
    )
    if tests.timed_out:
        return result(
            error=f"the tests did not finish within {task.verifier.timeout_s:g} s",
            timed_out=True,
            output=log_tail,
            exit_code=tests.exit_code,
        )
    if instance.parser != "junit":
        lookup = await _log_statuses(sandbox, instance, log)
        if lookup is None:
            return result(error="the test log cannot be read", output=log_tail, exit_code=tests.exit_code)
        if not lookup:
            return result(
                error=f"the test run reported no test (exit {tests.exit_code}); its runner did not start",
                infra_error=tests.exit_code in (126, 127),
                output=log_tail,
                exit_code=tests.exit_code,
            )
        resolved, report = grade_statuses(instance, lookup.get)
    else:
        try:
            report_bytes = await read_optional(sandbox, junit, max_bytes=JUNIT_MAX_BYTES)
        except SandboxFileError as exc:
            # pytest writes a regular file of a size in proportion to the tests: this one was tampered with.
            return result(error=f"the JUnit report cannot be read: {exc}", output=log_tail, exit_code=tests.exit_code)
        if report_bytes is None:
            return result(
                error=f"the test command wrote no JUnit report (exit {tests.exit_code}); pytest did not run to the end",
                infra_error=tests.exit_code in (126, 127),  # the command itself is missing: the environment's fault
                output=log_tail,
                exit_code=tests.exit_code,
            )
        try:
            statuses = parse_junit_xml(report_bytes)
        except JunitError as exc:
            return result(error=f"the JUnit report is unreadable: {exc}", output=log_tail, exit_code=tests.exit_code)
        resolved, report = grade_statuses(instance, lambda test: status_of(test, statuses))
    report["patch_applied"] = applied_with
    report["model_patch"] = patch
    return result(1.0 if resolved else 0.0, details=report, output=log_tail, exit_code=tests.exit_code)


async def _log_statuses(sandbox: Sandbox, instance: SweBenchInstance, log: str) -> dict[str, TestStatus] | None:
    """Per-test statuses from the whole test log (the tail is not enough: results are on every line)."""
    try:
        data = await sandbox.read_file(log, max_bytes=JUNIT_MAX_BYTES)
    except SandboxFileError:
        return None
    text = data.decode(errors="replace")
    return parse_django_log(text) if instance.parser == "django" else parse_sympy_log(text)
