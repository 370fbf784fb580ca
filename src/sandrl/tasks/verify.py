"""The task's side of an episode, over the Sandbox protocol: set up, run the oracle, verify.

``verify`` runs after the agent has finished. It writes the task's tests into the sandbox only
then (the agent never sees them), clears the reward directory first (so a reward file the agent
wrote cannot count), runs the test command with the verifier's timeout and environment, and reads
the reward the way the task's format defines it. Failed tests that needed the network in a sandbox
without one are an infrastructure error (:mod:`sandrl.tasks.offline`), not a reward 0.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Mapping
from types import MappingProxyType

from sandrl.errors import SandboxFileError, TaskError
from sandrl.sandbox.base import ExecResult, Sandbox
from sandrl.tasks import r2e_gym_eval, swebench_eval
from sandrl.tasks.envvars import resolve_env
from sandrl.tasks.offline import offline_failure
from sandrl.tasks.pytest_results import parse_short_summary
from sandrl.tasks.result import VerifyResult, tail
from sandrl.tasks.sandbox_io import empty_dir_command, read_optional, run, run_logged, upload_all
from sandrl.tasks.step_setup import prepare_step
from sandrl.tasks.task import TESTS_DIR, VERIFIER_LOGS_DIR, Task

TEST_LOG = f"{VERIFIER_LOGS_DIR}/test-output.txt"
"""The test command's interleaved output (Harbor keeps it at test-stdout.txt; the name is ours)."""
REWARD_MAX_BYTES = 64 << 10
"""Most bytes of ``reward.txt`` or ``reward.json`` read: one number, or a few named ones, are far less."""


async def prepare_environment(task: Task, sandbox: Sandbox) -> None:
    """What the task's environment needs before the agent starts, beyond the sandbox's image.

    SWE-bench: the repository at ``base_commit`` in ``/testbed`` (SWE-smith: at the bug's commit);
    R2E-Gym: its tests taken out of the sandbox until verify time. Harbor and Terminal-Bench
    environments come from their Dockerfile, which the image builder handles; here only the
    working directory is made, and a multi-step task's first step set up (its ``workdir/`` and
    ``setup.sh``: nothing runs between the environment's start and it, so a fork group shares it);
    each later step is set up just before its agent (:mod:`sandrl.tasks.step_setup`).
    """
    if task.swebench is not None:
        await swebench_eval.setup_repository(task, sandbox)
        return
    if task.r2e_gym is not None:
        await r2e_gym_eval.setup_repository(task, sandbox)
        return
    workdir = task.environment.workdir
    await run(sandbox, ["mkdir", "-p", "--", workdir], what="making the working directory")
    if task.steps:
        await prepare_step(task, 0, sandbox)


async def run_solution(task: Task, sandbox: Sandbox) -> ExecResult:
    """Run the task's reference solution (the oracle) in the sandbox, within the agent's time budget."""
    if task.solution is None:
        raise TaskError(
            f"task {task.id} has no reference solution "
            "(Harbor: solution/solve.sh; Terminal-Bench: solution.sh or solution.yaml)"
        )
    solution = task.solution
    await upload_all(sandbox, solution.uploads)
    return await sandbox.exec(
        solution.command,
        timeout_s=task.agent_timeout_s,
        cwd=task.environment.workdir,
        env=resolve_env(solution.env, where=f"task {task.id}: solution env"),
        stdin=solution.stdin.encode() if solution.stdin is not None else None,
    )


async def verify(task: Task, sandbox: Sandbox, *, patch: str | None = None) -> VerifyResult:
    """Judge the sandbox's state after the agent; ``patch`` (SWE-bench only) grades a given diff instead."""
    if task.verifier.reward == "swe-bench":
        return await swebench_eval.grade(task, sandbox, patch=patch)
    if patch is not None:
        raise TaskError(f"task {task.id} is a {task.format} task; only SWE-bench tasks are graded from a patch")
    if task.verifier.reward == "r2e-gym":
        return await r2e_gym_eval.grade(task, sandbox)
    if task.steps:
        raise TaskError(
            f"task {task.id} has {len(task.steps)} steps, each verified after its own agent: "
            "verify sandrl.tasks.multi_step.step_task(task, k) for step k (an episode does)"
        )
    start = time.monotonic()
    # One exec: count what the agent left running (before anything of the verifier's starts), then
    # clear the reward's directory.
    cleared = await run(
        sandbox,
        f"{LEFTOVERS} && {empty_dir_command(VERIFIER_LOGS_DIR)}",
        what="clearing the verifier's log directory",
    )
    leftovers = _count(cleared.stdout)
    await upload_all(sandbox, task.verifier.uploads)
    env = {"TEST_DIR": TESTS_DIR, **resolve_env(task.verifier.env, where=f"task {task.id}: verifier env")}
    result, output = await run_logged(
        sandbox,
        task.verifier.command,
        log=TEST_LOG,
        timeout_s=task.verifier.timeout_s,
        cwd=task.environment.workdir,
        env=env,
    )

    def done(
        reward: float, details: Mapping[str, object], *, error: str | None = None, infra: bool = False
    ) -> VerifyResult:
        return VerifyResult(
            reward=reward,
            passed=reward >= 1.0 and error is None,
            duration_s=time.monotonic() - start,
            details=MappingProxyType(dict(details)),
            stdout_tail=tail(output),
            exit_code=result.exit_code,
            timed_out=result.timed_out,
            error=error,
            infra_error=infra,
        )

    async def judge() -> VerifyResult:
        if result.timed_out:
            return done(0.0, {}, error=f"the tests did not finish within {task.verifier.timeout_s:g} s")
        if task.verifier.reward not in ("reward-file", "swebench-log"):
            reward, details, error = _read_pytest_summary(output, result.exit_code)
            return done(reward, details, error=error)
        if task.verifier.reward == "swebench-log":
            reward, details, error = read_swebench_markers(output)
        else:
            try:
                reward, details, error = await _read_reward_file(sandbox, task.verifier.reward_key)
            except SandboxFileError as exc:
                # A reward file that is there but is no file a test script writes (huge, a link to a device,
                # a FIFO, a directory): something the agent left running in the sandbox made it. Its failure.
                return done(0.0, {}, error=f"the reward file cannot be read: {exc}")
        if error is not None and leftovers:
            # Processes the agent left running could have removed or rewritten the reward file after
            # the test script wrote it: the agent's failure, or a policy could dodge every failing
            # reward by leaving a loop that deletes it.
            error += f" ({leftovers} processes the agent left running were alive when the verifier started)"
            return done(0.0, details, error=error)
        # No reward at all, from a sandbox with nothing else running: the test script is broken (Terminal-Bench
        # says of missing SWE-bench markers: "an issue from the server end").
        return done(reward, details, error=error, infra=error is not None)

    judged = await judge()
    if judged.passed or judged.infra_error:
        return judged
    offline = await offline_failure(sandbox, output, allow_internet=task.environment.allow_internet)
    if offline is None:
        return judged
    return dataclasses.replace(judged, reward=0.0, error=offline, infra_error=True)


LEFTOVERS = 'n=0; for p in /proc/[0-9]*; do p=${p#/proc/}; [ "$p" = 1 ] || [ "$p" = $$ ] || n=$((n + 1)); done; echo $n'
"""Prints how many processes the sandbox has besides its init and this shell (a builtin loop: no child)."""


def _count(stdout: str) -> int:
    """The number :data:`LEFTOVERS` printed (0 where it printed none)."""
    first = stdout.split("\n", 1)[0].strip()
    return int(first) if first.isdigit() else 0


async def _read_reward_file(sandbox: Sandbox, reward_key: str | None) -> tuple[float, dict[str, object], str | None]:
    """Harbor's reward: ``reward.txt`` (one number) first, else ``reward.json`` (named numbers)."""
    text_path, json_path = f"{VERIFIER_LOGS_DIR}/reward.txt", f"{VERIFIER_LOGS_DIR}/reward.json"
    raw = await read_optional(sandbox, text_path, max_bytes=REWARD_MAX_BYTES)
    if raw is not None:
        try:
            value = float(raw.decode().strip())
        except (UnicodeDecodeError, ValueError):
            return 0.0, {}, f"{text_path} does not hold a number: {raw[:200]!r}"
        if not math.isfinite(value):
            return 0.0, {}, f"{text_path} holds {value}, not a finite number"
        return value, {"rewards": {"reward": value}}, None
    raw = await read_optional(sandbox, json_path, max_bytes=REWARD_MAX_BYTES)
    if raw is None:
        return 0.0, {}, f"the test script wrote neither {text_path} nor {json_path}"
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        return 0.0, {}, f"{json_path} is not valid JSON: {raw[:200]!r}"
    if not isinstance(data, dict) or not data:
        return 0.0, {}, f'{json_path} must be an object of named rewards, e.g. {{"reward": 1.0}}'
    rewards: dict[str, float] = {}
    for name, value in data.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            return 0.0, {}, f"{json_path}: reward {name!r} is {value!r}, not a number"
        rewards[str(name)] = float(value)
    reward, rule = reward_of(rewards, reward_key)
    if reward is None:
        return 0.0, {"rewards": rewards}, f"{json_path} has no reward {reward_key!r} ([verifier] reward_key): {rule}"
    return reward, {"rewards": rewards, "reward_rule": rule}, None


def reward_of(rewards: Mapping[str, float], key: str | None = None) -> tuple[float | None, str]:
    """The reward of a set of named rewards, and the rule that chose it (for the record).

    Harbor's own rule comes first: the key ``reward``, else the only key. Harbor has none for
    several keys without a ``reward`` (it reports each key, and no primary reward); sandrl takes
    the key the task names in ``[verifier] reward_key``, else the mean of all the values (a task
    that scores parts of the work, e.g. ``{"tests": 1, "style": 0.5}``, gets partial credit).
    None when the named key is missing.
    """
    if key is not None:
        if key in rewards:
            return rewards[key], f"the key {key!r} ([verifier] reward_key)"
        return None, f"it has {', '.join(sorted(rewards))}"
    if "reward" in rewards:
        return rewards["reward"], "the key 'reward'"
    if len(rewards) == 1:
        name, value = next(iter(rewards.items()))
        return value, f"the only key, {name!r}"
    return sum(rewards.values()) / len(rewards), f"the mean of {', '.join(sorted(rewards))}"


SWEBENCH_START = "SWEBench results starts here"
SWEBENCH_END = "SWEBench results ends here"


def read_swebench_markers(output: str) -> tuple[float, dict[str, object], str | None]:
    """Terminal-Bench's ``swebench`` parser: the text after the first start marker and before the
    last end marker, stripped, is ``PASSED`` (reward 1) or anything else (reward 0)."""
    if SWEBENCH_START not in output or SWEBENCH_END not in output:
        return (
            0.0,
            {},
            f"the test output has no '{SWEBENCH_START}' ... '{SWEBENCH_END}' block; run-tests.sh must print "
            "the SWE-bench verdict (PASSED or FAILED) between them",
        )
    block = output.split(SWEBENCH_START, 1)[1].rsplit(SWEBENCH_END, 1)[0].strip()
    passed = block == "PASSED"
    return (1.0 if passed else 0.0), {"swebench": block[:200]}, None


def _read_pytest_summary(output: str, exit_code: int) -> tuple[float, dict[str, object], str | None]:
    """Terminal-Bench: every test in pytest's short summary passed (and pytest said so with exit 0)."""
    statuses = parse_short_summary(output)
    if statuses is None:
        return 0.0, {}, "no 'short test summary info' in the test output; run-tests.sh must run pytest with -rA"
    tests = {name: status.value for name, status in statuses.items()}
    # The exit status guards against a summary-shaped text the tests printed after pytest's own.
    passed = bool(statuses) and all(status.ok for status in statuses.values()) and exit_code == 0
    return (1.0 if passed else 0.0), {"tests": tests}, None
