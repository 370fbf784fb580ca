"""Harbor multi-step tasks: loaded from [[steps]] and steps/, verified step by step with Harbor's reward rule."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from sandrl.errors import InvalidTaskError
from sandrl.tasks import Task, TaskWarning, load_harbor_task, load_tasks, prepare_environment, run_solution, verify

from .conftest import FIXTURES, BwrapSandbox, SandboxFactory

MULTI = FIXTURES / "harbor" / "multi-step"


def _load(task_dir: Path = MULTI) -> Task:
    with pytest.warns(TaskWarning) as record:
        task = load_harbor_task(task_dir)
    # One warning, and it says what is not represented.
    assert [str(w.message).split(": ", 1)[1] for w in record] == [
        "a multi-step task (2 steps): sandrl gives the agent every step's instruction at once and verifies the "
        "steps in order after it has finished (Harbor verifies each step before the next begins)"
    ]
    return task


def test_steps_are_loaded_from_task_toml_and_the_steps_directory() -> None:
    task = _load()
    assert [s.name for s in task.steps] == ["01-create", "02-extend"] and task.step_reward == "mean"
    first, second = task.steps
    assert first.instruction == "Create /app/notes.txt holding the line `one`.\n"
    assert task.instruction.startswith("This task has 2 steps.")
    assert "## Step 1 of 2: 01-create\n\nCreate /app/notes.txt" in task.instruction
    assert "## Step 2 of 2: 02-extend\n\nAdd the line `two`" in task.instruction
    # Timeouts: the step's own, else the task's; the agent does every step in one run.
    assert (first.agent_timeout_s, second.agent_timeout_s, task.agent_timeout_s) == (30.0, 60.0, 90.0)
    assert (first.verifier.timeout_s, second.verifier.timeout_s, task.verifier.timeout_s) == (30.0, 20.0, 50.0)
    # The task's tests/, then the step's files over it; a step without tests/ gets the task's.
    assert dict(first.verifier.uploads) == {
        "/tests": MULTI / "tests",
        "/tests/test.sh": MULTI / "steps" / "01-create" / "tests" / "test.sh",
    }
    assert dict(second.verifier.uploads) == {"/tests": MULTI / "tests"}
    assert dict(second.verifier.env) == {"NOTES": "/app/notes.txt", "EXPECTED": "two"}
    assert first.min_reward == {"reward": 1.0} and second.min_reward is None
    assert first.workdir_files == MULTI / "steps" / "01-create" / "workdir" and second.workdir_files is None
    assert task.solution is not None and set(task.solution.uploads) == {
        "/solution/.sandrl-steps/01-create",
        "/solution/.sandrl-steps/02-extend",
    }
    assert not task.extra


async def _sandbox(task: Task, make_sandbox: SandboxFactory) -> BwrapSandbox:
    sandbox = make_sandbox(workdir=task.environment.workdir, env=task.to_sandbox_spec().env)
    await prepare_environment(task, sandbox)
    return sandbox


async def test_the_oracle_passes_every_step(make_sandbox: SandboxFactory) -> None:
    task = _load()
    sandbox = await _sandbox(task, make_sandbox)
    # The steps' workdir/ was copied in and its setup.sh run before the agent.
    assert (sandbox.root / "app" / "setup-ran.txt").read_text() == "seed\n"
    assert (await run_solution(task, sandbox)).exit_code == 0
    assert (sandbox.root / "app" / "notes.txt").read_text() == "one\ntwo\n"
    result = await verify(task, sandbox)
    assert (result.reward, result.passed, result.error, result.infra_error) == (1.0, True, None, False)
    assert [(s["step"], s["reward"]) for s in result.details["steps"]] == [("01-create", 1.0), ("02-extend", 1.0)]
    assert result.details["rewards"] == {"reward": 1.0}


async def test_rewards_roll_up_as_harbor_rolls_them(make_sandbox: SandboxFactory, tmp_path: Path) -> None:
    task = _load()
    sandbox = await _sandbox(task, make_sandbox)
    notes = sandbox.root / "app" / "notes.txt"
    notes.write_text("one\n")  # step 1 done, step 2 not
    result = await verify(task, sandbox)
    assert (result.reward, result.passed) == (0.5, False)  # mean over the two steps
    assert "mean over the steps" in str(result.details["reward_rule"])

    final = replace(task, step_reward="final")
    assert (await verify(final, sandbox)).reward == 0.0  # the last step's

    # Step 1 below its min_reward: Harbor runs no further step, and the mean is over the steps run.
    notes.write_text("two\n")
    result = await verify(task, sandbox)
    steps = result.details["steps"]
    assert isinstance(steps, list) and [s["step"] for s in steps] == ["01-create"] and steps[0]["stopped"]
    assert (result.reward, result.passed, result.infra_error) == (0.0, False, False)


async def test_a_step_with_a_broken_test_script_is_an_infra_error(make_sandbox: SandboxFactory, tmp_path: Path) -> None:
    task_dir = tmp_path / "multi"
    shutil.copytree(MULTI, task_dir)
    (task_dir / "tests" / "test.sh").write_text("#!/bin/bash\ntrue\n")  # step 2's: writes no reward
    task = _load(task_dir)
    sandbox = await _sandbox(task, make_sandbox)
    (sandbox.root / "app" / "notes.txt").write_text("one\ntwo\n")
    result = await verify(task, sandbox)
    assert result.infra_error and result.error is not None and result.error.startswith("step 02-extend: ")


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
    with pytest.warns(TaskWarning, match="multi-step task"):
        tasks, problems = load_tasks(tmp_path / "suite")
    assert problems == [] and [t.id for t in tasks] == ["multi-step"]
