"""SWE-bench grading in a real (bubblewrap) sandbox on an instance built from a tmp git repository.

These should also run against sandrl.sandbox.bwrap once it lands: swap the make_sandbox fixture.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from sandrl.tasks import Task, load_task, prepare_environment, run_solution, verify
from sandrl.tasks.swebench_eval import PATCH_MAX_BYTES

from .conftest import (
    CALC_BASE,
    CALC_FIXED,
    FAIL_TO_PASS,
    PASS_TO_PASS,
    TESTS_BASE,
    BwrapSandbox,
    CalcRepo,
    SandboxFactory,
)


def _task(calc_repo: CalcRepo) -> Task:
    return load_task(calc_repo.write(calc_repo.mirror.parent / "instances.jsonl", calc_repo.record()))


async def _prepared(calc_repo: CalcRepo, make_sandbox: SandboxFactory) -> tuple[Task, BwrapSandbox]:
    task = _task(calc_repo)
    sandbox = make_sandbox(workdir=task.environment.workdir)
    await prepare_environment(task, sandbox)
    return task, sandbox


def _naive_log_status(output: str) -> dict[str, str]:
    """SWE-bench's pytest log parser (parse_log_pytest): status words at the start of a line."""
    statuses: dict[str, str] = {}
    for line in output.split("\n"):
        if line.startswith(("PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL")):
            words = line.replace(" - ", " ").split()
            if len(words) > 1:
                statuses[words[1]] = words[0]
    return statuses


async def test_the_repository_is_at_base_commit_without_its_future(
    calc_repo: CalcRepo, make_sandbox: SandboxFactory
) -> None:
    _, sandbox = await _prepared(calc_repo, make_sandbox)
    assert (sandbox.root / "testbed" / "calc.py").read_text() == CALC_BASE
    head = await sandbox.exec("git rev-parse HEAD && git log --all --format=%H | wc -l && git status --porcelain")
    assert head.stdout.split() == [calc_repo.base, "1"]  # one commit reachable, a clean tree
    # The fix is a later commit of the clone; it must not be in the sandbox at all.
    assert (await sandbox.exec(f"git cat-file -e {calc_repo.fix}")).exit_code != 0
    assert (await sandbox.exec("git -C /testbed commit -q --allow-empty -m probe")).exit_code == 0


async def test_gold_patch_resolves(calc_repo: CalcRepo, make_sandbox: SandboxFactory) -> None:
    task, sandbox = await _prepared(calc_repo, make_sandbox)
    applied = await run_solution(task, sandbox)
    assert applied.exit_code == 0, applied.stderr
    assert (sandbox.root / "testbed" / "calc.py").read_text() == CALC_FIXED
    result = await verify(task, sandbox)
    assert result.error is None, result.stdout_tail
    assert (result.reward, result.passed, result.infra_error) == (1.0, True, False)
    assert result.details["FAIL_TO_PASS"] == {"success": FAIL_TO_PASS, "failure": {}}
    assert result.details["PASS_TO_PASS"] == {"success": PASS_TO_PASS, "failure": {}}
    assert result.details["patch_applied"] == "git apply --verbose"


async def test_an_untouched_repository_is_an_empty_patch(calc_repo: CalcRepo, make_sandbox: SandboxFactory) -> None:
    task, sandbox = await _prepared(calc_repo, make_sandbox)
    result = await verify(task, sandbox)
    assert (result.reward, result.passed, result.infra_error) == (0.0, False, False)
    assert result.error is not None and "empty patch" in result.error


async def test_a_fix_that_breaks_a_pass_to_pass_test_is_not_resolved(
    calc_repo: CalcRepo, make_sandbox: SandboxFactory
) -> None:
    task, sandbox = await _prepared(calc_repo, make_sandbox)
    # The agent fixes add but breaks mul, and "fixes" test_mul to hide it; SWE-bench resets test files.
    broken = CALC_FIXED.replace("return a * b", "return a ** b")
    (sandbox.root / "testbed" / "calc.py").write_text(broken)
    (sandbox.root / "testbed" / "test_calc.py").write_text(TESTS_BASE.replace("== 12", "== 81"))
    result = await verify(task, sandbox)
    assert (result.reward, result.passed) == (0.0, False)
    assert result.error is None
    assert result.details["FAIL_TO_PASS"] == {"success": FAIL_TO_PASS, "failure": {}}
    assert result.details["PASS_TO_PASS"] == {
        "success": ["test_calc.py::test_add_zero"],
        "failure": {"test_calc.py::test_mul": "FAILED"},
    }


async def test_a_new_file_from_the_agent_is_part_of_its_patch(
    calc_repo: CalcRepo, make_sandbox: SandboxFactory
) -> None:
    task, sandbox = await _prepared(calc_repo, make_sandbox)
    testbed = sandbox.root / "testbed"
    (testbed / "adding.py").write_text("def plus(a, b):\n    return a + b\n")
    (testbed / "calc.py").write_text(
        CALC_BASE.replace("return a - b", "from adding import plus\n    return plus(a, b)")
    )
    # The agent tried its change, leaving bytecode behind; that is not part of the answer.
    tried = await sandbox.exec("python3 -c 'import calc; assert calc.add(2, 3) == 5' && ls __pycache__")
    assert tried.exit_code == 0 and "calc." in tried.stdout
    result = await verify(task, sandbox)
    assert (result.reward, result.passed) == (1.0, True), result.stdout_tail
    patch = result.details["model_patch"]
    assert isinstance(patch, str) and "b/adding.py" in patch and "b/calc.py" in patch
    assert "__pycache__" not in patch


async def test_a_patch_that_does_not_apply(calc_repo: CalcRepo, make_sandbox: SandboxFactory) -> None:
    task, sandbox = await _prepared(calc_repo, make_sandbox)
    stale = calc_repo.patch.replace("-    return a - b", "-    return a // b")  # context that is not there
    result = await verify(task, sandbox, patch=stale)
    assert (result.reward, result.passed, result.infra_error) == (0.0, False, False)
    assert result.error is not None and "does not apply" in result.error
    assert result.details["patch_applied"] is False
    # Every fallback was tried, and none left a half-applied change behind.
    for command in ("git apply --verbose", "git apply --verbose --reject", "patch --batch --fuzz=5 -p1 -i"):
        assert f"$ {command}\n" in result.stdout_tail
    assert (sandbox.root / "testbed" / "calc.py").read_text() == CALC_BASE


async def test_a_fuzzy_patch_applies_with_the_patch_fallback(calc_repo: CalcRepo, make_sandbox: SandboxFactory) -> None:
    task, sandbox = await _prepared(calc_repo, make_sandbox)
    # A wrong line number and a changed context line: git apply refuses, patch --fuzz accepts.
    fuzzy = calc_repo.patch.replace("@@ -1,5 +1,5 @@", "@@ -3,5 +3,5 @@").replace(" def mul(a, b):", " def mul(x, y):")
    assert fuzzy != calc_repo.patch
    result = await verify(task, sandbox, patch=fuzzy)
    assert result.details["patch_applied"] == "patch --batch --fuzz=5 -p1 -i", result.stdout_tail
    assert (result.reward, result.passed) == (1.0, True)


async def test_a_given_patch_is_graded_instead_of_the_working_tree(
    calc_repo: CalcRepo, make_sandbox: SandboxFactory
) -> None:
    task, sandbox = await _prepared(calc_repo, make_sandbox)
    (sandbox.root / "testbed" / "calc.py").write_text("garbage that would not even import(\n")
    result = await verify(task, sandbox, patch=calc_repo.patch)
    assert (result.reward, result.passed) == (1.0, True)


async def test_printed_passed_lines_do_not_fake_a_resolution(calc_repo: CalcRepo, make_sandbox: SandboxFactory) -> None:
    task, sandbox = await _prepared(calc_repo, make_sandbox)
    # add stays wrong, but after pytest's own summary the process prints the lines a log parser wants.
    fake = "".join(f"PASSED {test}\\n" for test in FAIL_TO_PASS)
    cheat = f'import atexit, sys\natexit.register(lambda: sys.stdout.write("{fake}"))\n\n' + CALC_BASE
    (sandbox.root / "testbed" / "calc.py").write_text(cheat)
    result = await verify(task, sandbox)
    # The cheat works on printed text: SWE-bench's own log parser would call every FAIL_TO_PASS test passed...
    assert all(_naive_log_status(result.stdout_tail)[test] == "PASSED" for test in FAIL_TO_PASS)
    # ...but the JUnit report pytest wrote says otherwise.
    assert (result.reward, result.passed) == (0.0, False)
    failures = result.details["FAIL_TO_PASS"]
    assert isinstance(failures, dict) and set(failures["failure"]) == set(FAIL_TO_PASS)


async def test_a_test_run_that_times_out(calc_repo: CalcRepo, make_sandbox: SandboxFactory, tmp_path: Path) -> None:
    task, sandbox = await _prepared(calc_repo, make_sandbox)
    slow = CALC_FIXED.replace("return a + b", "import time\n    time.sleep(30)\n    return a + b")
    (sandbox.root / "testbed" / "calc.py").write_text(slow)
    quick = replace(task, verifier=replace(task.verifier, timeout_s=2.0))
    result = await verify(quick, sandbox)
    assert (result.reward, result.passed, result.timed_out, result.infra_error) == (0.0, False, True, False)


async def test_a_missing_test_runner_is_an_infra_error(calc_repo: CalcRepo, make_sandbox: SandboxFactory) -> None:
    task, sandbox = await _prepared(calc_repo, make_sandbox)
    assert task.swebench is not None
    broken = replace(task, swebench=replace(task.swebench, test_command="no-such-pytest -rA"))
    result = await verify(broken, sandbox, patch=calc_repo.patch)
    assert (result.reward, result.infra_error, result.exit_code) == (0.0, True, 127)
    assert result.error is not None and "no JUnit report" in result.error


async def test_a_patch_over_the_bound_is_graded_a_failure(calc_repo: CalcRepo, make_sandbox: SandboxFactory) -> None:
    # Issue #18: the patch is read back from the sandbox, so its size is the agent's to choose.
    task, sandbox = await _prepared(calc_repo, make_sandbox)
    lines = PATCH_MAX_BYTES // 64 + 1
    await sandbox.exec(f"yes {'x' * 62} | head -n {lines} > /testbed/big.txt", timeout_s=60)
    result = await verify(task, sandbox)
    assert (result.reward, result.passed, result.infra_error) == (0.0, False, False)
    assert result.error is not None and f"larger than {PATCH_MAX_BYTES} bytes" in result.error
