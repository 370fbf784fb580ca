"""The Terminal-Bench 1 loader on real-shaped task directories, the legacy form and broken ones."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sandrl.errors import InvalidTaskError
from sandrl.tasks import TaskWarning, load_terminal_bench_task

from .conftest import FIXTURES

COUNT = FIXTURES / "terminal-bench" / "count-lines"
LEGACY = FIXTURES / "terminal-bench" / "legacy-descriptions"


def test_count_lines_reads_task_yaml_and_the_files_around_it() -> None:
    task = load_terminal_bench_task(COUNT)
    assert (task.id, task.format) == ("count-lines", "terminal-bench")
    assert task.instruction.startswith("The file /app/data.txt has one record per line.")
    assert (task.agent_timeout_s, task.verifier.timeout_s) == (180.0, 30.0)
    assert task.metadata == {
        "author_name": "Grace",
        "author_email": "grace@example.invalid",
        "difficulty": "easy",
        "category": "file-operations",
        "tags": ["coreutils", "counting"],
        "expert_time_estimate_min": 2,
        "junior_time_estimate_min": 5,
    }
    env = task.environment
    assert env.dockerfile == COUNT / "Dockerfile"
    assert env.compose_file == COUNT / "docker-compose.yaml"
    assert env.context_dir == COUNT
    assert env.base_image == "ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624"
    assert env.workdir == "/app"
    verifier = task.verifier
    assert verifier.reward == "pytest-summary"
    assert verifier.command == "bash /tests/run-tests.sh"
    # tests/ first, then run-tests.sh into it: the order the harness copies them in.
    assert list(verifier.uploads.items()) == [
        ("/tests", COUNT / "tests"),
        ("/tests/run-tests.sh", COUNT / "run-tests.sh"),
    ]
    assert dict(verifier.env) == {"TEST_DIR": "/tests"}
    assert task.solution is not None and task.solution.command == "bash /solution/solution.sh"
    assert dict(task.solution.uploads) == {"/solution/solution.sh": COUNT / "solution.sh"}


def test_legacy_descriptions_default_tests_and_solution_yaml() -> None:
    task = load_terminal_bench_task(LEGACY)
    assert task.instruction == "Create /app/out.txt containing the word done."  # the "base" description
    assert (task.agent_timeout_s, task.verifier.timeout_s) == (360.0, 60.0)  # the adapter's defaults
    assert task.environment.workdir == "/app"  # WORKDIR / then WORKDIR app
    assert task.environment.base_image == "ubuntu:22.04"  # FROM continued over two lines
    assert task.verifier.command == "python3 -m pytest -rA /tests/test_outputs.py"  # no run-tests.sh
    assert task.solution is not None
    assert task.solution.command == "cd /app\necho done > out.txt\n"
    assert dict(task.extra) == {}  # test_scripts is a known key of the harness


def _copy(tmp_path: Path, source: Path = COUNT) -> Path:
    task_dir = tmp_path / source.name
    shutil.copytree(source, task_dir)
    return task_dir


def test_unknown_keys_are_kept_and_warned(tmp_path: Path) -> None:
    task_dir = _copy(tmp_path)
    config = task_dir / "task.yaml"
    config.write_text(config.read_text() + "flaky: true\nmax_agent_timeout: 10\n")
    with pytest.warns(TaskWarning, match="unknown keys flaky, max_agent_timeout"):
        task = load_terminal_bench_task(task_dir)
    assert dict(task.extra) == {"flaky": True, "max_agent_timeout": 10}


def test_same_shell_and_keystroke_solutions_are_warned(tmp_path: Path) -> None:
    task_dir = _copy(tmp_path, LEGACY)
    (task_dir / "task.yaml").write_text((task_dir / "task.yaml").read_text() + "run_tests_in_same_shell: true\n")
    (task_dir / "solution.yaml").write_text("- command: vim out.txt\n- command: C-c\n  append_enter: false\n")
    with pytest.warns(TaskWarning) as record:
        task = load_terminal_bench_task(task_dir)
    messages = "\n".join(str(w.message) for w in record)
    assert "fresh shell" in messages and "keystrokes" in messages
    assert task.solution is None


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        ("instruction: [unclosed\n", r"is not valid YAML"),
        ("- just\n- a list\n", r"the top level must be a table of keys, got a list"),
        ("author_name: x\n", r"instruction is missing; add instruction: \|"),
        ("instruction: '   '\n", r"instruction is empty"),
        ("instruction: 42\n", r"instruction must be a string, got 42"),
        ("descriptions: []\n", r"descriptions must be a non-empty list"),
        ("descriptions:\n  - key: base\n    description: 7\n", r"the description of 'base' must be a string"),
        ("instruction: hi\nmax_test_timeout_sec: soon\n", r"max_test_timeout_sec must be a number of seconds > 0"),
        ("instruction: hi\nrun_tests_in_same_shell: maybe\n", r"run_tests_in_same_shell must be true or false"),
        ("instruction: hi\ntags: web\n", r"tags must be a list of strings"),
        ("instruction: hi\nparser_name: swelancer\n", r"parser_name 'swelancer' is not supported"),
    ],
)
def test_malformed_task_yaml_names_the_problem(tmp_path: Path, yaml_text: str, expected: str) -> None:
    task_dir = _copy(tmp_path)
    (task_dir / "task.yaml").write_text(yaml_text)
    with pytest.raises(InvalidTaskError, match=expected) as info:
        load_terminal_bench_task(task_dir)
    assert str(task_dir / "task.yaml") in str(info.value)


def test_missing_machine_and_missing_tests(tmp_path: Path) -> None:
    task_dir = _copy(tmp_path)
    (task_dir / "Dockerfile").unlink()
    (task_dir / "docker-compose.yaml").unlink()
    with pytest.raises(InvalidTaskError, match="has no Dockerfile"):
        load_terminal_bench_task(task_dir)

    task_dir = _copy(tmp_path / "second")
    (task_dir / "run-tests.sh").unlink()
    (task_dir / "tests" / "test_outputs.py").unlink()
    with pytest.raises(InvalidTaskError, match=r"neither run-tests\.sh nor tests/test_outputs\.py"):
        load_terminal_bench_task(task_dir)


def test_malformed_solution_yaml(tmp_path: Path) -> None:
    task_dir = _copy(tmp_path, LEGACY)
    (task_dir / "solution.yaml").write_text("command: not a list\n")
    with pytest.raises(InvalidTaskError, match=r"solution\.yaml: must be a list of entries"):
        load_terminal_bench_task(task_dir)
    (task_dir / "solution.yaml").write_text("- min_timeout_sec: 3\n")
    with pytest.raises(InvalidTaskError, match="entry 1 has no command"):
        load_terminal_bench_task(task_dir)
