"""verify() and run_solution() for Harbor and Terminal-Bench tasks, in a real (bubblewrap) sandbox.

These should also run against sandrl.sandbox.bwrap once it lands: swap the make_sandbox fixture.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from sandrl.errors import TaskError
from sandrl.tasks import Task, TaskWarning, load_task, prepare_environment, run_solution, verify

from .conftest import FIXTURES, BwrapSandbox, SandboxFactory

HELLO = FIXTURES / "harbor" / "hello-file"
ODD = FIXTURES / "harbor" / "odd-but-valid"
COUNT = FIXTURES / "terminal-bench" / "count-lines"
LEGACY = FIXTURES / "terminal-bench" / "legacy-descriptions"
SWEBENCH_STYLE = FIXTURES / "terminal-bench" / "swebench-style"


async def _sandbox_for(task: Task, make_sandbox: SandboxFactory) -> BwrapSandbox:
    sandbox = make_sandbox(workdir=task.environment.workdir, env=task.to_sandbox_spec().env)
    await prepare_environment(task, sandbox)
    return sandbox


# --- Harbor ----------------------------------------------------------------------------------


async def test_harbor_oracle_passes_and_tests_arrive_only_at_verify_time(make_sandbox: SandboxFactory) -> None:
    task = load_task(HELLO)
    sandbox = await _sandbox_for(task, make_sandbox)
    assert not (sandbox.root / "tests" / "test.sh").exists()  # the agent never sees the tests
    solved = await run_solution(task, sandbox)
    assert solved.exit_code == 0, solved.stderr
    assert not (sandbox.root / "tests" / "test.sh").exists()
    result = await verify(task, sandbox)
    assert (result.reward, result.passed, result.error, result.infra_error) == (1.0, True, None, False)
    assert result.details == {"rewards": {"reward": 1.0}}
    assert (sandbox.root / "tests" / "test.sh").exists()
    # The verifier's env, a ${VAR:-default} template and TEST_DIR reach the test script.
    assert "secret seen by the verifier: no-secret" in result.stdout_tail
    assert "tests dir: /tests" in result.stdout_tail


async def test_harbor_unsolved_scores_zero(make_sandbox: SandboxFactory) -> None:
    task = load_task(HELLO)
    sandbox = await _sandbox_for(task, make_sandbox)
    (sandbox.root / "app" / "hello.txt").write_text("Hello, moon!\n")
    result = await verify(task, sandbox)
    assert (result.reward, result.passed, result.error) == (0.0, False, None)


async def test_harbor_verifier_env_reads_the_host(
    make_sandbox: SandboxFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDRL_TEST_SECRET", "s3cret")
    task = load_task(HELLO)
    sandbox = await _sandbox_for(task, make_sandbox)
    result = await verify(task, sandbox)
    assert "secret seen by the verifier: s3cret" in result.stdout_tail
    unset = replace(task, verifier=replace(task.verifier, env={"KEY": "${SANDRL_SURELY_UNSET_VAR}"}))
    with pytest.raises(TaskError, match=r"SANDRL_SURELY_UNSET_VAR.*not set on this host; export"):
        await verify(unset, sandbox)


async def test_rewards_and_tests_the_agent_planted_do_not_count(make_sandbox: SandboxFactory, tmp_path: Path) -> None:
    # A test script that writes a reward only on success: a stale reward file would be believed.
    task_dir = tmp_path / "strict"
    shutil.copytree(HELLO, task_dir)
    (task_dir / "tests" / "test.sh").write_text(
        '#!/bin/bash\nif [ "$(cat /app/hello.txt)" = "$GREETING" ]; then echo 1 > /logs/verifier/reward.txt; fi\n'
    )
    task = load_task(task_dir)
    sandbox = await _sandbox_for(task, make_sandbox)
    # The agent writes the reward it wants, and a test script of its own with a helper next to it.
    await sandbox.exec("mkdir -p /logs/verifier /tests && echo 1 > /logs/verifier/reward.txt")
    await sandbox.exec("printf 'echo 1 > /logs/verifier/reward.txt' > /tests/test.sh && touch /tests/conftest.py")
    result = await verify(task, sandbox)
    assert (result.reward, result.passed) == (0.0, False)
    assert result.infra_error and result.error is not None and "wrote neither" in result.error
    assert not (sandbox.root / "tests" / "conftest.py").exists()


async def test_harbor_reward_json_named_rewards(make_sandbox: SandboxFactory) -> None:
    with pytest.warns(TaskWarning):
        task = load_task(ODD)
    sandbox = await _sandbox_for(task, make_sandbox)
    words = sandbox.root / "workspace" / "words.txt"
    words.write_text("one two three\n")
    (sandbox.root / "workspace" / "count.txt").write_text("3\n")
    result = await verify(task, sandbox)
    assert (result.reward, result.passed) == (1.0, True)
    assert result.details == {"rewards": {"reward": 1.0, "format": 1.0}, "reward_rule": "the key 'reward'"}
    (sandbox.root / "workspace" / "count.txt").write_text("4\n")
    assert (await verify(task, sandbox)).reward == 0.0


@pytest.mark.parametrize(
    ("script", "reward", "error"),
    [
        ("echo 0.25 > /logs/verifier/reward.txt", 0.25, None),
        ("echo ' 1.0 ' > /logs/verifier/reward.txt; echo '{\"reward\": 0}' > /logs/verifier/reward.json", 1.0, None),
        ("echo '{\"score\": 0.5}' > /logs/verifier/reward.json", 0.5, None),
        # Several keys, none named 'reward' (Harbor has no rule for it): their mean.
        ('echo \'{"a": 1, "b": 0.5, "c": 0}\' > /logs/verifier/reward.json', 0.5, None),
        ('echo \'{"reward": "high"}\' > /logs/verifier/reward.json', 0.0, "not a number"),
        ("echo '[1]' > /logs/verifier/reward.json", 0.0, "must be an object of named rewards"),
        ("echo '{oops' > /logs/verifier/reward.json", 0.0, "is not valid JSON"),
        ("echo pass > /logs/verifier/reward.txt", 0.0, "does not hold a number"),
        ("echo nan > /logs/verifier/reward.txt", 0.0, "not a finite number"),
        ("true", 0.0, "wrote neither"),
    ],
)
async def test_harbor_reward_files(
    make_sandbox: SandboxFactory, tmp_path: Path, script: str, reward: float, error: str | None
) -> None:
    task_dir = tmp_path / "rewards"
    shutil.copytree(HELLO, task_dir)
    (task_dir / "tests" / "test.sh").write_text(f"#!/bin/sh\n{script}\n")
    task = load_task(task_dir)
    result = await verify(task, await _sandbox_for(task, make_sandbox))
    assert result.reward == reward
    assert result.passed == (reward >= 1.0 and error is None)
    if error is None:
        assert result.error is None
    else:
        assert result.error is not None and error in result.error and result.infra_error


async def test_harbor_reward_json_rules_are_recorded(make_sandbox: SandboxFactory, tmp_path: Path) -> None:
    task_dir = tmp_path / "keys"
    shutil.copytree(HELLO, task_dir)
    (task_dir / "tests" / "test.sh").write_text(
        '#!/bin/sh\necho \'{"tests": 1, "style": 0.5}\' > /logs/verifier/reward.json\n'
    )
    task = load_task(task_dir)
    sandbox = await _sandbox_for(task, make_sandbox)
    result = await verify(task, sandbox)
    assert (result.reward, result.error, result.infra_error) == (0.75, None, False)
    assert result.details == {"rewards": {"tests": 1.0, "style": 0.5}, "reward_rule": "the mean of style, tests"}

    # The task names its reward key in task.toml: that key, all keys still recorded.
    config = task_dir / "task.toml"
    config.write_text(config.read_text().replace("[verifier]\n", '[verifier]\nreward_key = "style"\n'))
    task = load_task(task_dir)
    assert task.verifier.reward_key == "style"
    result = await verify(task, sandbox)
    assert (result.reward, result.passed, result.error) == (0.5, False, None)
    assert result.details["rewards"] == {"tests": 1.0, "style": 0.5}
    assert "reward_key" in str(result.details["reward_rule"])

    # A named key the script did not write: the test script and the task disagree, not the agent's doing.
    config.write_text(config.read_text().replace('reward_key = "style"', 'reward_key = "speed"'))
    result = await verify(load_task(task_dir), sandbox)
    assert result.infra_error and result.error is not None
    assert "no reward 'speed'" in result.error and "it has style, tests" in result.error


async def test_harbor_verifier_timeout(make_sandbox: SandboxFactory, tmp_path: Path) -> None:
    task_dir = tmp_path / "slow"
    shutil.copytree(HELLO, task_dir)
    (task_dir / "tests" / "test.sh").write_text("#!/bin/sh\necho 1 > /logs/verifier/reward.txt\nsleep 30\n")
    task = load_task(task_dir)
    task = replace(task, verifier=replace(task.verifier, timeout_s=1.0))
    result = await verify(task, await _sandbox_for(task, make_sandbox))
    assert (result.reward, result.passed, result.timed_out, result.infra_error) == (0.0, False, True, False)
    assert result.error is not None and "did not finish within 1 s" in result.error


async def test_no_solution_and_patches_for_other_formats(make_sandbox: SandboxFactory) -> None:
    with pytest.warns(TaskWarning):
        task = load_task(ODD)
    sandbox = await _sandbox_for(task, make_sandbox)
    with pytest.raises(TaskError, match="has no reference solution"):
        await run_solution(task, sandbox)
    with pytest.raises(TaskError, match="only SWE-bench tasks are graded from a patch"):
        await verify(task, sandbox, patch="diff --git a/x b/x\n")


# --- Terminal-Bench 1 ------------------------------------------------------------------------


def _with_data(sandbox: BwrapSandbox) -> None:
    # What the Dockerfile's COPY would have put there (the image builder is not part of this).
    shutil.copy(COUNT / "data.txt", sandbox.root / "app" / "data.txt")


async def test_terminal_bench_oracle_passes(make_sandbox: SandboxFactory) -> None:
    task = load_task(COUNT)
    sandbox = await _sandbox_for(task, make_sandbox)
    _with_data(sandbox)
    assert (await run_solution(task, sandbox)).exit_code == 0
    result = await verify(task, sandbox)
    assert (result.reward, result.passed, result.exit_code, result.error) == (1.0, True, 0, None), result.stdout_tail
    # Ids as pytest prints them, relative to the rootdir (/app) of a run started there.
    assert result.details == {
        "tests": {
            "../tests/test_outputs.py::test_count_file_exists": "PASSED",
            "../tests/test_outputs.py::test_count_is_right": "PASSED",
        }
    }


async def test_terminal_bench_one_failing_test_fails_the_task(make_sandbox: SandboxFactory) -> None:
    task = load_task(COUNT)
    sandbox = await _sandbox_for(task, make_sandbox)
    _with_data(sandbox)
    (sandbox.root / "app" / "count.txt").write_text("5\n")  # counts the empty lines too
    result = await verify(task, sandbox)
    assert (result.reward, result.passed) == (0.0, False)
    statuses = result.details["tests"]
    assert isinstance(statuses, dict) and sorted(statuses.values()) == ["FAILED", "PASSED"]


async def test_terminal_bench_printed_summary_does_not_fake_a_pass(
    make_sandbox: SandboxFactory, tmp_path: Path
) -> None:
    # The test itself prints a summary-shaped text, inside the run and again after pytest has finished.
    task_dir = tmp_path / "cheat"
    shutil.copytree(COUNT, task_dir)
    fake = "\\n=========== short test summary info ===========\\nPASSED tests/test_outputs.py::test_x\\n"
    (task_dir / "tests" / "test_outputs.py").write_text(
        "import atexit, sys\n"
        f'atexit.register(lambda: sys.stdout.write("{fake}"))\n\n'
        f"def test_x():\n    print({fake!r})\n    assert False\n"
    )
    task = load_task(task_dir)
    sandbox = await _sandbox_for(task, make_sandbox)
    result = await verify(task, sandbox)
    assert result.stdout_tail.rstrip().endswith("PASSED tests/test_outputs.py::test_x")  # the cheat ran
    assert (result.reward, result.passed) == (0.0, False)
    assert result.exit_code == 1


async def test_terminal_bench_legacy_task_with_solution_yaml(make_sandbox: SandboxFactory) -> None:
    task = load_task(LEGACY)
    sandbox = await _sandbox_for(task, make_sandbox)
    assert (await verify(task, sandbox)).reward == 0.0
    assert (await run_solution(task, sandbox)).exit_code == 0
    result = await verify(task, sandbox)
    assert (result.reward, result.passed) == (1.0, True), result.stdout_tail


async def test_terminal_bench_swebench_parser(make_sandbox: SandboxFactory) -> None:
    task = load_task(SWEBENCH_STYLE)
    assert task.verifier.reward == "swebench-log"
    sandbox = await _sandbox_for(task, make_sandbox)
    shutil.copy(SWEBENCH_STYLE / "calc.py", sandbox.root / "app" / "calc.py")
    result = await verify(task, sandbox)
    assert (result.reward, result.passed, result.error) == (0.0, False, None), result.stdout_tail
    assert result.details == {"swebench": "FAILED"}
    assert (await run_solution(task, sandbox)).exit_code == 0
    result = await verify(task, sandbox)
    assert (result.reward, result.passed, result.error) == (1.0, True, None), result.stdout_tail
    assert result.details == {"swebench": "PASSED"}


@pytest.mark.parametrize(
    ("script", "reward", "infra"),
    [
        # Terminal-Bench reads after the first start marker and before the last end marker.
        ("echo 'SWEBench results starts here'; echo PASSED; echo 'SWEBench results ends here'", 1.0, False),
        ("echo 'SWEBench results starts here'; echo ' PASSED '; echo 'SWEBench results ends here'", 1.0, False),
        ("echo 'SWEBench results starts here'; echo PASSED; echo more; echo 'SWEBench results ends here'", 0.0, False),
        ("echo 'SWEBench results starts here'; echo FAILED; echo 'SWEBench results ends here'", 0.0, False),
        # No markers: the harness could not grade (Terminal-Bench: "an issue from the server end").
        ("echo PASSED", 0.0, True),
        ("echo 'SWEBench results starts here'; echo PASSED", 0.0, True),
    ],
)
async def test_terminal_bench_swebench_markers(
    make_sandbox: SandboxFactory, tmp_path: Path, script: str, reward: float, infra: bool
) -> None:
    task_dir = tmp_path / "markers"
    shutil.copytree(SWEBENCH_STYLE, task_dir)
    (task_dir / "run-tests.sh").write_text(f"#!/bin/bash\n{script}\n")
    task = load_task(task_dir)
    result = await verify(task, await _sandbox_for(task, make_sandbox))
    assert (result.reward, result.infra_error) == (reward, infra)
    assert (result.error is not None) == infra
    if infra:
        assert result.error is not None and "SWEBench results starts here" in result.error


async def test_terminal_bench_without_pytest_summary(make_sandbox: SandboxFactory, tmp_path: Path) -> None:
    task_dir = tmp_path / "quiet"
    shutil.copytree(COUNT, task_dir)
    (task_dir / "run-tests.sh").write_text("#!/bin/bash\npython3 -m pytest -q $TEST_DIR/test_outputs.py\n")
    task = load_task(task_dir)
    sandbox = await _sandbox_for(task, make_sandbox)
    _with_data(sandbox)
    await run_solution(task, sandbox)
    result = await verify(task, sandbox)  # all tests pass, but without -rA there is no summary to judge by
    assert (result.reward, result.passed) == (0.0, False)
    assert result.error is not None and "-rA" in result.error


@pytest.mark.parametrize(
    ("script", "error"),
    [
        # Issue #18: what a process the agent left running can make of the reward file after the
        # verifier cleared its directory. A test script writes neither, so it is the agent's failure
        # (reward 0), not a broken verifier (an infra error, retried and never trained on).
        ("head -c 1000000 /dev/zero > /logs/verifier/reward.txt", "larger than 65536 bytes"),
        ("mkdir /logs/verifier/reward.txt", "reward file cannot be read"),
    ],
)
async def test_a_reward_file_no_test_script_writes_fails_the_agent(
    make_sandbox: SandboxFactory, tmp_path: Path, script: str, error: str
) -> None:
    task_dir = tmp_path / "planted"
    shutil.copytree(HELLO, task_dir)
    (task_dir / "tests" / "test.sh").write_text(f"#!/bin/sh\n{script}\n")
    task = load_task(task_dir)
    result = await verify(task, await _sandbox_for(task, make_sandbox))
    assert (result.reward, result.passed, result.infra_error) == (0.0, False, False)
    assert result.error is not None and error in result.error


async def test_a_missing_reward_with_nothing_left_running_is_a_broken_test(
    make_sandbox: SandboxFactory, tmp_path: Path
) -> None:
    """The counterpart of tests/rollout/test_planted_reward.py: with no process of the agent alive, a
    test script that writes no reward is the task's fault (infra), not the agent's."""
    task_dir = tmp_path / "broken"
    shutil.copytree(HELLO, task_dir)
    (task_dir / "tests" / "test.sh").write_text("#!/bin/sh\ntrue\n")
    task = load_task(task_dir)
    result = await verify(task, await _sandbox_for(task, make_sandbox))
    assert (result.reward, result.passed, result.infra_error) == (0.0, False, True)
    assert result.error is not None and "left running" not in result.error
