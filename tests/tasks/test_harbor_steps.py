"""Harbor multi-step tasks: loaded from [[steps]] and steps/; each step set up, solved and verified on its own."""

from __future__ import annotations

import shutil
import warnings
from dataclasses import replace
from pathlib import Path

import pytest

from sandrl.errors import InvalidTaskError, TaskError
from sandrl.tasks import Task, load_harbor_task, load_tasks, prepare_environment, run_solution, verify
from sandrl.tasks.multi_step import (
    ARTIFACT_FILES,
    ARTIFACT_STEP_TEXT_BYTES,
    ARTIFACT_TEXT_BYTES,
    below_min_reward,
    collect_artifacts,
    roll_up,
    step_record,
    step_task,
)
from sandrl.tasks.step_setup import check_step, prepare_step
from sandrl.tasks.task import Healthcheck

from .conftest import FIXTURES, BwrapSandbox, SandboxFactory

MULTI = FIXTURES / "harbor" / "multi-step"


def _load(task_dir: Path = MULTI) -> Task:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a multi-step task runs as Harbor runs it: nothing to warn about
        return load_harbor_task(task_dir)


def test_steps_are_loaded_from_task_toml_and_the_steps_directory() -> None:
    task = _load()
    assert [s.name for s in task.steps] == ["01-create", "02-extend"] and task.step_reward == "mean"
    first, second = task.steps
    assert first.instruction == "Create /app/notes.txt holding the line `one`.\n"
    # The whole task's instruction is for listings; each step's agent gets the step's own.
    assert task.instruction.startswith("This task has 2 steps, given to the agent one at a time")
    assert "## Step 2 of 2: 02-extend\n\nAdd the line `two`" in task.instruction
    assert step_task(task, 1).instruction == second.instruction and step_task(task, 1).steps == ()
    # Timeouts: the step's own, else the task's; the task's are the sums (the sandbox's TTL covers every step).
    assert (first.agent_timeout_s, second.agent_timeout_s, task.agent_timeout_s) == (30.0, 60.0, 90.0)
    assert (first.verifier.timeout_s, second.verifier.timeout_s, task.verifier.timeout_s) == (30.0, 20.0, 50.0)
    assert step_task(task, 0).agent_timeout_s == 30.0 and step_task(task, 0).verifier == first.verifier
    # The task's tests/, then the step's files over it; a step without tests/ gets the task's.
    assert dict(first.verifier.uploads) == {
        "/tests": MULTI / "tests",
        "/tests/test.sh": MULTI / "steps" / "01-create" / "tests" / "test.sh",
    }
    assert dict(second.verifier.uploads) == {"/tests": MULTI / "tests"}
    assert dict(second.verifier.env) == {"NOTES": "/app/notes.txt", "EXPECTED": "two"}
    assert first.min_reward == {"reward": 1.0} and second.min_reward is None
    assert first.workdir_files == MULTI / "steps" / "01-create" / "workdir" and second.workdir_files is None
    # Each step's own solution (the oracle runs it before that step's verifier); the task's is every step's.
    assert first.solution is not None and dict(first.solution.uploads) == {
        "/solution": MULTI / "steps/01-create/solution"
    }
    assert step_task(task, 1).solution == second.solution
    assert task.solution is not None and set(task.solution.uploads) == {
        "/solution/.sandrl-steps/01-create",
        "/solution/.sandrl-steps/02-extend",
    }
    assert first.healthcheck is None and first.artifacts == ("/logs/artifacts",)
    assert not task.extra


def test_healthcheck_artifacts_and_a_fallback_solution_are_read(tmp_path: Path) -> None:
    task_dir = _edited(
        tmp_path,
        'name = "02-extend"\n',
        'name = "02-extend"\nartifacts = ["/app/notes.txt", { source = "out/" }]\n'
        '[steps.healthcheck]\ncommand = "test -f /app/notes.txt"\nretries = 2\ninterval_sec = 0.5\n',
    )
    config = task_dir / "task.toml"
    config.write_text('artifacts = ["/app/log.txt"]\n' + config.read_text())
    shutil.rmtree(task_dir / "steps" / "02-extend" / "solution")
    (task_dir / "solution").mkdir()
    (task_dir / "solution" / "solve.sh").write_text("echo two >> /app/notes.txt\n")
    first, second = _load(task_dir).steps
    assert first.artifacts == ("/app/log.txt", "/logs/artifacts")
    assert second.artifacts == ("/app/log.txt", "/app/notes.txt", "out/", "/logs/artifacts")
    assert second.healthcheck == Healthcheck("test -f /app/notes.txt", interval_s=0.5, retries=2)
    # Harbor's oracle falls back to the task's solution/ for a step without its own.
    assert second.solution is not None and second.solution.uploads["/solution"] == task_dir / "solution"


async def _sandbox(task: Task, make_sandbox: SandboxFactory) -> BwrapSandbox:
    sandbox = make_sandbox(workdir=task.environment.workdir, env=task.to_sandbox_spec().env)
    await prepare_environment(task, sandbox)
    return sandbox


async def _step(task: Task, index: int, sandbox: BwrapSandbox, *, solve: bool) -> dict[str, object]:
    if index > 0:  # the first step's setup is the environment's (prepare_environment)
        await prepare_step(task, index, sandbox)
    await check_step(task, index, sandbox)
    view = step_task(task, index)
    if solve:
        assert (await run_solution(view, sandbox)).exit_code == 0
    return step_record(task.steps[index].name, await verify(view, sandbox))


async def test_the_oracle_passes_every_step(make_sandbox: SandboxFactory) -> None:
    task = _load()
    sandbox = await _sandbox(task, make_sandbox)
    # The first step's workdir/ was copied in and its setup.sh run with the environment's setup.
    assert (sandbox.root / "app" / "setup-ran.txt").read_text() == "seed\n"
    records = [await _step(task, 0, sandbox, solve=True)]
    records.append(await _step(task, 1, sandbox, solve=True))
    assert (sandbox.root / "app" / "notes.txt").read_text() == "one\ntwo\n"
    result = roll_up(task, records, None, duration_s=0.0)
    assert result is not None
    assert (result.reward, result.passed, result.error, result.infra_error) == (1.0, True, None, False)
    assert [(s["step"], s["reward"]) for s in records] == [("01-create", 1.0), ("02-extend", 1.0)]
    assert result.details["rewards"] == {"reward": 1.0}


async def test_rewards_roll_up_as_harbor_rolls_them(make_sandbox: SandboxFactory) -> None:
    task = _load()
    sandbox = await _sandbox(task, make_sandbox)
    records = [await _step(task, 0, sandbox, solve=True), await _step(task, 1, sandbox, solve=False)]
    assert not below_min_reward(task, 0, records[0])
    result = roll_up(task, records, None, duration_s=0.0)
    assert result is not None and (result.reward, result.passed) == (0.5, False)  # mean over the two steps
    assert "mean over the steps" in str(result.details["reward_rule"])
    final = roll_up(replace(task, step_reward="final"), records, None, duration_s=0.0)
    assert final is not None and final.reward == 0.0  # the last step's
    # Step 1 below its min_reward (1.0): Harbor runs no further step.
    failing = await _step(task, 0, await _sandbox(task, make_sandbox), solve=False)
    assert failing["reward"] == 0.0 and below_min_reward(task, 0, failing)
    assert not below_min_reward(task, 1, records[1])  # no min_reward: a 0 goes on


async def test_the_previous_steps_tests_are_gone_before_the_next_step(make_sandbox: SandboxFactory) -> None:
    task = _load()
    sandbox = await _sandbox(task, make_sandbox)
    await _step(task, 0, sandbox, solve=True)
    assert (sandbox.root / "tests" / "test.sh").exists() and (
        sandbox.root / "logs" / "verifier" / "reward.txt"
    ).exists()
    await prepare_step(task, 1, sandbox)
    assert list((sandbox.root / "tests").iterdir()) == [] and list((sandbox.root / "logs" / "verifier").iterdir()) == []


async def test_a_step_with_a_broken_test_script_is_an_infra_error(make_sandbox: SandboxFactory, tmp_path: Path) -> None:
    task_dir = tmp_path / "multi"
    shutil.copytree(MULTI, task_dir)
    (task_dir / "tests" / "test.sh").write_text("#!/bin/bash\ntrue\n")  # step 2's: writes no reward
    task = _load(task_dir)
    sandbox = await _sandbox(task, make_sandbox)
    (sandbox.root / "app" / "notes.txt").write_text("one\ntwo\n")
    result = await verify(step_task(task, 1), sandbox)
    assert result.infra_error and result.error is not None
    with pytest.raises(TaskError, match="each verified after its own agent"):
        await verify(task, sandbox)


def _edited(tmp_path: Path, old: str, new: str) -> Path:
    task_dir = tmp_path / "edited"
    shutil.copytree(MULTI, task_dir)
    config = task_dir / "task.toml"
    assert old in config.read_text()
    config.write_text(config.read_text().replace(old, new, 1))
    return task_dir


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ('multi_step_reward_strategy = "mean"', 'multi_step_reward_strategy = "best"', r"must be mean or final"),
        ('name = "02-extend"', 'name = "01-create"', r"name '01-create' is used twice"),
        ('name = "02-extend"', 'name = "../escape"', r"is not a portable directory name"),
        ('name = "02-extend"', 'name = "03-missing"', r"steps/03-missing/instruction\.md is missing"),
        ("min_reward = 1.0", 'min_reward = "all"', r"min_reward must be a number or a table of numbers"),
    ],
)
def test_malformed_steps_are_reported(tmp_path: Path, old: str, new: str, expected: str) -> None:
    with pytest.raises(InvalidTaskError, match=expected):
        load_harbor_task(_edited(tmp_path, old, new))


def test_a_step_without_any_test_script(tmp_path: Path) -> None:
    task_dir = _edited(tmp_path, "min_reward = 1.0", "min_reward = 1.0")
    (task_dir / "tests" / "test.sh").unlink()
    with pytest.raises(
        InvalidTaskError, match=r"step 02-extend has no test script; add steps/02-extend/tests/test\.sh"
    ):
        load_harbor_task(task_dir)


def test_a_suite_with_a_multi_step_task_loads(tmp_path: Path) -> None:
    shutil.copytree(MULTI, tmp_path / "suite" / "multi-step")
    tasks, problems = load_tasks(tmp_path / "suite")
    assert problems == [] and [t.id for t in tasks] == ["multi-step"]


async def test_artifacts_are_recorded_within_their_bounds(make_sandbox: SandboxFactory, tmp_path: Path) -> None:
    task_dir = _edited(tmp_path, 'name = "02-extend"\n', 'name = "02-extend"\nartifacts = ["/app/out", "gone.txt"]\n')
    task = _load(task_dir)
    sandbox = await _sandbox(task, make_sandbox)
    out = sandbox.root / "app" / "out"
    out.mkdir()
    (out / "binary").write_bytes(b"\x7fELF\x00\x01")
    for k in range(40):  # more files than are recorded, more text than is kept
        (out / f"f{k:02}.txt").write_text(f"{k:02}" * 2500)
    records = await collect_artifacts(task, 1, sandbox)
    assert len(records) == ARTIFACT_FILES + 1  # the files, then the missing one
    assert records[-1] == {"path": "/app/gone.txt", "missing": True}
    files = records[:-1]
    assert all(str(r["path"]).startswith("/app/out/") for r in files)
    assert sum(len(str(r.get("text", ""))) for r in files) <= ARTIFACT_STEP_TEXT_BYTES
    kept = [r for r in files if "text" in r]
    assert kept and all(r["truncated"] and len(str(r["text"])) <= ARTIFACT_TEXT_BYTES for r in kept)
    assert all(r["bytes"] in (5000, 6) for r in files)
    assert not any("text" in r for r in files if r["path"] == "/app/out/binary")
