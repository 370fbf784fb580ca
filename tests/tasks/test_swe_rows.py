"""SWE-Gym, SWE-smith and R2E-Gym rows as their datasets publish them (JSONL, Parquet) become tasks;
a malformed row is skipped with its id and the reason, and the rest load."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest

from sandrl.errors import InvalidTaskError
from sandrl.tasks import detect_format, load_swebench_instances, load_tasks
from sandrl.tasks.r2e_gym import gold_patch
from sandrl.tasks.r2e_gym_eval import summary_statuses
from sandrl.tasks.swebench_specs import CONDA_ACTIVATE, harness_test_command, instance_image

from .conftest import FAIL_TO_PASS, PASS_TO_PASS, CalcRepo
from .swe_rows import (
    R2E_EXPECTED,
    SMITH_FALLBACK_ID,
    SMITH_IMAGE,
    SMITH_MIRROR,
    SWE_GYM_ID,
    SWE_GYM_IMAGE,
    parsed_commit,
    r2e_commit,
    r2e_row,
    smith_mirror,
    swe_gym_row,
    swe_smith_row,
    write_rows,
)


def _parquet() -> None:
    pytest.importorskip("pyarrow", reason="Parquet files are read with pyarrow")


# --- SWE-Gym -----------------------------------------------------------------------------------


def test_a_swe_gym_row_runs_in_swe_gyms_image_with_its_forks_test_command(calc_repo: CalcRepo, tmp_path: Path) -> None:
    _parquet()
    file = write_rows(tmp_path / "train-00000-of-00001.parquet", [swe_gym_row(calc_repo)])
    tasks, errors = load_swebench_instances(file)  # unset swebench_images, no clone: the published image
    assert errors == []
    (task,) = tasks
    assert (task.id, task.format) == (SWE_GYM_ID, "swe-bench")
    assert task.environment.docker_image == SWE_GYM_IMAGE
    instance = task.swebench
    assert instance is not None and instance.repo_source is None
    assert instance.fail_to_pass == tuple(FAIL_TO_PASS) and instance.pass_to_pass == tuple(PASS_TO_PASS)
    assert instance.test_command == "pytest -rA test_calc.py test_more.py"  # the fork's iterative/dvc command
    assert instance.test_prelude == CONDA_ACTIVATE and instance.environment_setup_commit is None
    assert task.solution is not None and task.solution.stdin == calc_repo.patch


@pytest.mark.parametrize(
    ("repo", "version", "test_patch", "command", "prelude"),
    [
        (
            "getmoto/moto",
            "5.0",
            "diff --git a/tests/test_s3.py b/tests/test_s3.py\n",
            "pytest -n0 -rA tests/test_s3.py",
            "",
        ),
        (
            "conan-io/conan",
            "2.0",
            "diff --git a/test/t.py b/test/t.py\n",
            "pytest -n0 -rA test/t.py",
            "export PYTHONPATH=${PYTHONPATH:-}:$(pwd)",
        ),
        (
            "Project-MONAI/MONAI",
            "1.3",
            "diff --git a/tests/test_x.py b/tests/test_x.py\n",
            "pytest -rA tests/test_x.py",
            "",
        ),
        # mypy's tests are data-file cases picked by name, from the test patch's [case ...] headers.
        (
            "python/mypy",
            "1.5",
            "diff --git a/data/check-x.test b/data/check-x.test\n+[case testOne]\n+[case testTwo]\n",
            "pytest -n0 -rA -k 'testOne or testTwo'",
            "",
        ),
        (
            "python/mypy",
            "1.10",
            "diff --git a/data/check-x.test b/data/check-x.test\n+[case testOne]\n",
            "pytest -rA -k testOne",
            "",
        ),
    ],
)
def test_swe_gyms_test_commands(
    calc_repo: CalcRepo, tmp_path: Path, repo: str, version: str, test_patch: str, command: str, prelude: str
) -> None:
    owner, name = repo.split("/")
    row = swe_gym_row(calc_repo, repo=repo, instance_id=f"{owner}__{name}-7", version=version, test_patch=test_patch)
    (task,), errors = load_swebench_instances(write_rows(tmp_path / "gym.jsonl", [row]))
    assert errors == [] and task.swebench is not None
    assert task.swebench.test_command == command
    assert task.swebench.test_prelude == "\n".join(filter(None, [CONDA_ACTIVATE, prelude]))
    assert task.environment.docker_image == f"xingyaoww/sweb.eval.x86_64.{owner.lower()}_s_{name.lower()}-7:latest"
    assert harness_test_command(repo, version, task.swebench.test_files, test_patch) == command


def test_swe_gym_images_are_an_image_set_of_their_own() -> None:
    assert instance_image("Project-MONAI__MONAI-6969", "swegym") == (
        "xingyaoww/sweb.eval.x86_64.project-monai_s_monai-6969:latest"
    )
    assert instance_image("getmoto__moto-7365", "mirror:5000/{swegym_key}") == "mirror:5000/getmoto_s_moto-7365"


# --- SWE-smith ---------------------------------------------------------------------------------


def test_a_swe_smith_row_runs_in_its_repositorys_image_with_its_profiles_test_command(tmp_path: Path) -> None:
    _parquet()
    mirror = smith_mirror(tmp_path)
    file = write_rows(tmp_path / "train-00000-of-00001.parquet", [swe_smith_row(mirror)])
    assert detect_format(file) == "swe-smith"
    (task,), errors = load_swebench_instances(file, images="local")  # SWE-smith's rows name their image
    assert errors == []
    assert (task.id, task.format, task.environment.docker_image) == (SMITH_FALLBACK_ID, "swe-smith", SMITH_IMAGE)
    assert task.environment.workdir == "/testbed" and task.environment.allow_internet is False
    instance = task.swebench
    assert instance is not None and instance.repo == SMITH_MIRROR
    assert instance.bug_patch == mirror.bug and instance.patch == "" and instance.test_patch == ""
    assert instance.base_commit == "e" * 40
    assert instance.test_command == "pytest --disable-warnings --color=no --tb=no --verbose test_calc.py test_more.py"
    assert instance.test_files == ("test_calc.py", "test_more.py")
    assert instance.test_prelude == CONDA_ACTIVATE and instance.parser == "junit"
    # Only the PASS_TO_PASS tests of the files that run are graded, as SWE-smith's harness grades them.
    assert instance.pass_to_pass == tuple(PASS_TO_PASS)
    assert task.metadata["PASS_TO_PASS_not_graded"] == 1
    # The oracle undoes the bug.
    assert task.solution is not None and task.solution.stdin == mirror.bug and "--reverse" in task.solution.command


def test_swe_smith_profiles_that_differ(tmp_path: Path) -> None:
    mirror = smith_mirror(tmp_path)
    mypy = swe_smith_row(
        mirror,
        instance_id="python__mypy.e93f06ce.pr_1",
        repo="swesmith/python__mypy.e93f06ce",
        FAIL_TO_PASS=["mypy/test/testcheck.py::TypeCheckSuite::check-x.test::testOne"],
        PASS_TO_PASS=[
            "mypy/test/testcheck.py::TypeCheckSuite::check-x.test::testOne",
            "mypy/test/testcheck.py::TypeCheckSuite::check-y.test::testOther",
        ],
    )
    paramiko = swe_smith_row(
        mirror, instance_id="paramiko__paramiko.23f92003.x", repo="swesmith/paramiko__paramiko.23f92003"
    )
    tasks, errors = load_swebench_instances(write_rows(tmp_path / "smith.jsonl", [mypy, paramiko]))
    assert errors == []
    by_id = {task.id: task.swebench for task in tasks}
    mypy_instance, paramiko_instance = by_id["python__mypy.e93f06ce.pr_1"], by_id["paramiko__paramiko.23f92003.x"]
    assert mypy_instance is not None and paramiko_instance is not None
    assert mypy_instance.test_command == "pytest --color=no -rA -k testOne"
    assert len(mypy_instance.pass_to_pass) == 1  # the cases the -k picks
    assert paramiko_instance.test_command == "pytest -rA --color=no --disable-warnings test_calc.py test_more.py"
    # The caller's command replaces the profile's.
    (task,), _ = load_swebench_instances(write_rows(tmp_path / "one.jsonl", [paramiko]), test_command="pytest -q")
    assert task.swebench is not None and task.swebench.test_command == "pytest -q test_calc.py test_more.py"


# --- R2E-Gym -----------------------------------------------------------------------------------


def test_an_r2e_gym_row_runs_in_its_image_with_its_tests_and_expected_statuses(
    calc_repo: CalcRepo, tmp_path: Path
) -> None:
    _parquet()
    commit = r2e_commit(calc_repo, tmp_path)
    file = write_rows(tmp_path / "data" / "train-00000-of-00001.parquet", [r2e_row(commit)])
    assert detect_format(file) == "r2e-gym"
    tasks, problems = load_tasks(file.parent)  # a dataset's data/ directory of shards
    assert problems == []
    (task,) = tasks
    assert (task.id, task.format) == (f"calc__{commit.new}", "r2e-gym")
    assert task.environment.docker_image == f"namanjain12/calc_final:{commit.new}"
    assert task.verifier.reward == "r2e-gym" and task.swebench is None
    instance = task.r2e_gym
    assert instance is not None
    assert (instance.repo_name, instance.commit_hash, instance.old_commit) == ("calc", commit.new, commit.old)
    assert dict(instance.expected) == R2E_EXPECTED
    assert (instance.tests_dir, instance.run_tests) == ("/r2e_tests", "/testbed/run_tests.sh")
    assert task.metadata["modified_files"] == ["calc.py"] and "parsed_commit_content" not in task.metadata
    # The oracle is the commit's Python diff: calc.py, not the README.
    assert task.solution is not None and task.solution.stdin is not None
    assert "diff --git a/calc.py b/calc.py" in task.solution.stdin and "README" not in task.solution.stdin


def test_r2e_gyms_parsed_commit_is_rebuilt_as_the_diff_it_was(calc_repo: CalcRepo, tmp_path: Path) -> None:
    commit = r2e_commit(calc_repo, tmp_path)
    files = {chunk.split(" b/", 1)[0]: "diff --git " + chunk for chunk in commit.diff.split("diff --git ")[1:]}
    assert set(files) == {"a/README.md", "a/calc.py"}
    assert gold_patch(parsed_commit(commit)) == files["a/calc.py"]  # Python files only, byte for byte


def test_r2e_gyms_summary_is_read_as_its_parser_reads_it_but_only_the_last_one() -> None:
    log = (
        "=== short test summary info ===\n"
        "PASSED r2e_tests/test_1.py::test_add\n"  # printed by a test: not the real summary
        "=== 1 passed ===\n"
        "r2e_tests/test_1.py .F\n"
        "\x1b[32m=== short test summary info ===\x1b[0m\n"
        "PASSED r2e_tests/test_1.py::TestAdd::test_commutes\n"
        "PASSED r2e_tests/test_1.py::test_f[a b]\n"
        "FAILED r2e_tests/test_1.py::test_add - assert -1 == 5\n"
        "ERROR r2e_tests/test_1.py - ImportError: x\n"
        "SKIPPED [1] r2e_tests/test_1.py:3: no\n"
        "XFAIL r2e_tests/test_1.py::test_x\n"
        "=== 1 failed, 2 passed in 0.1s ===\n"
    )
    assert summary_statuses(log) == {
        "TestAdd.test_commutes": "PASSED",
        "test_f[a b]": "PASSED",
        "test_add": "FAILED",
        "": "ERROR",  # a file that did not import: R2E-Gym names it "" too
    }
    assert summary_statuses("no summary at all\n") is None


# --- malformed rows ------------------------------------------------------------------------------


def _bad_rows(calc: CalcRepo, tmp_path: Path) -> list[tuple[dict[str, object], str, str]]:
    """Malformed rows of each format: the row, the id its problem names, and the reason it gives."""
    mirror = smith_mirror(tmp_path / "smith")
    commit = r2e_commit(calc, tmp_path)
    r2e = f"calc__{commit.new}"
    no_python = parsed_commit(commit)
    no_python["file_diffs"] = no_python["file_diffs"][:1]  # the README only
    bad_line = parsed_commit(commit)
    bad_line["file_diffs"][1]["hunks"][0]["line_group"]["all_lines"][0]["type"] = "moved"

    def gym(ident: str, **fields: object) -> dict[str, object]:
        return swe_gym_row(calc, instance_id=ident, **fields)

    def smith(**fields: object) -> dict[str, object]:
        return swe_smith_row(mirror, "acme__calc.0123abcd.bad", **fields)

    tornado = "tornadoweb__tornado.d5ac65c1.x"
    return [
        (gym("iterative__dvc-2", FAIL_TO_PASS=[]), "iterative__dvc-2", r"FAIL_TO_PASS is empty"),
        (gym("iterative__dvc-3", base_commit=7), "iterative__dvc-3", r"base_commit must be a string"),
        (smith(image_name=None), "acme__calc.0123abcd.bad", r"image_name must be a string, got null"),
        (smith(image_name="bad image"), "acme__calc.0123abcd.bad", r"image_name: 'bad image' is not an image"),
        (smith(repo="acme/calc"), "acme__calc.0123abcd.bad", r"repo must be SWE-smith's mirror"),
        (smith(patch="not a diff"), "acme__calc.0123abcd.bad", r"patch is not a git diff"),
        (smith(FAIL_TO_PASS=["TestFoo"]), "acme__calc.0123abcd.bad", r"'TestFoo', not a pytest id"),
        (
            swe_smith_row(mirror, "acme__calc.0123abcd.rs", FAIL_TO_PASS=["tests::parse::x"]),
            "acme__calc.0123abcd.rs",
            r"'tests::parse::x', not a pytest id",
        ),
        (smith(PASS_TO_PASS="[oops"), "acme__calc.0123abcd.bad", r"PASS_TO_PASS is a string but not a JSON list"),
        (smith(problem_statement=""), "acme__calc.0123abcd.bad", r"problem_statement is missing or empty"),
        (smith(base_commit="HEAD"), "acme__calc.0123abcd.bad", r"base_commit must be a commit sha"),
        (
            swe_smith_row(mirror, tornado, repo="swesmith/tornadoweb__tornado.d5ac65c1"),
            tornado,
            r"run with 'python -m tornado.test --verbose', not pytest",
        ),
        (r2e_row(commit, docker_image=3), r2e, r"docker_image must be a string, got an integer"),
        (r2e_row(commit, commit_hash="main"), "calc__main", r"commit_hash must be a commit sha"),
        (r2e_row(commit, expected_output_json="{}"), r2e, r"expected_output_json is empty"),
        (r2e_row(commit, expected_output_json="[]"), r2e, r"expected_output_json must be a JSON object"),
        (
            r2e_row(commit, expected_output_json=json.dumps({"test_a": "SKIPPED"})),
            r2e,
            r"'test_a' the status 'SKIPPED', not one of PASSED, FAILED, ERROR",
        ),
        (r2e_row(commit, parsed_commit_content="{"), r2e, r"is not R2E-Gym's parsed commit: Expecting property"),
        (
            r2e_row(commit, parsed_commit_content=json.dumps(bad_line)),
            r2e,
            r"file_diffs\[1\]\.hunks\[0\]\.line_group\.all_lines\[0\]\.type must be one of",
        ),
        (r2e_row(commit, parsed_commit_content=json.dumps(no_python)), r2e, r"changes no Python file"),
        (r2e_row(commit, problem_statement=None), r2e, r"problem_statement is missing or empty"),
    ]


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_malformed_rows_are_skipped_with_their_id_and_why(calc_repo: CalcRepo, tmp_path: Path, suffix: str) -> None:
    if suffix == ".parquet":
        _parquet()
    bad = _bad_rows(calc_repo, tmp_path)
    mirror = smith_mirror(tmp_path / "good")
    good = [swe_gym_row(calc_repo), swe_smith_row(mirror), r2e_row(r2e_commit(calc_repo, tmp_path / "good"))]
    rows = [*good, *(row for row, _, _ in bad)]
    data = tmp_path / "rows"
    if suffix == ".parquet":
        # A Parquet column has one type, and these rows' types differ: a shard each.
        for index, row in enumerate(rows):
            write_rows(data / f"train-{index:05d}-of-{len(rows):05d}.parquet", [row])
    else:
        write_rows(data / "mixed.jsonl", rows)  # one file may mix the formats: each row is told by its keys
    tasks, problems = load_tasks(data)
    assert sorted(task.format for task in tasks) == ["r2e-gym", "swe-bench", "swe-smith"]  # the good rows load
    assert len(problems) == len(bad)
    for _, ident, reason in bad:
        found = [p for p in problems if f"({ident!r})" in p.problem and re.search(reason, p.problem)]
        assert len(found) == 1, (ident, reason, [p.problem for p in problems])
        assert found[0].path.suffix == suffix


def test_parquet_without_pyarrow_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "train-00000-of-00001.parquet"
    file.write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # what an interpreter without it does on import
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(InvalidTaskError, match=r"reading Parquet needs pyarrow, which is not installed: pip install"):
        load_swebench_instances(file)
    tasks, problems = load_tasks(tmp_path)
    assert tasks == [] and "needs pyarrow" in problems[0].problem


def test_a_file_that_is_not_parquet_is_reported(tmp_path: Path) -> None:
    _parquet()
    file = tmp_path / "rows.parquet"
    file.write_text("not parquet\n")
    tasks, problems = load_tasks(file)
    assert tasks == [] and len(problems) == 1 and "is not a readable Parquet file" in problems[0].problem


def test_quoting_of_the_mypy_case_names() -> None:
    # A case name comes from the dataset: it reaches the shell quoted.
    patch = "diff --git a/t.test b/t.test\n+[case test'; touch /pwned; ']\n"
    command = harness_test_command("python/mypy", "1.5", (), patch)
    assert shlex.split(command)[-2:] == ["-k", "test'; touch /pwned; '"]


def test_json_nested_too_deeply_for_the_parser_is_a_bad_row_not_a_crash(calc_repo: CalcRepo, tmp_path: Path) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    commit = r2e_commit(calc_repo, tmp_path)
    rows = [
        r2e_row(commit, expected_output_json=deep),
        r2e_row(commit, commit_hash="a" * 40, parsed_commit_content=deep),
        swe_smith_row(smith_mirror(tmp_path), FAIL_TO_PASS=deep),
        swe_gym_row(calc_repo),
    ]
    tasks, problems = load_tasks(write_rows(tmp_path / "rows" / "deep.jsonl", rows))
    assert [task.id for task in tasks] == [SWE_GYM_ID]
    assert len(problems) == 3 and all("nested too deeply" in problem.problem for problem in problems), problems
    whole = tmp_path / "rows" / "deep-line.jsonl"
    whole.write_text(deep + "\n")
    tasks, problems = load_tasks(whole)
    assert tasks == [] and "deep-line.jsonl:1: is not valid JSON (nested too deeply)" in problems[0].problem
