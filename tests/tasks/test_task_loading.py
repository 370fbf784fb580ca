"""load_task / load_tasks: format detection, whole task sets, and every kind of bad task reported."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sandrl.errors import InvalidTaskError
from sandrl.tasks import TaskProblem, TaskWarning, detect_format, load_task, load_tasks

from .conftest import FIXTURES, CalcRepo


def test_detect_format(tmp_path: Path, calc_repo: CalcRepo) -> None:
    assert detect_format(FIXTURES / "harbor" / "hello-file") == "harbor"
    assert detect_format(FIXTURES / "terminal-bench" / "count-lines") == "terminal-bench"
    assert detect_format(calc_repo.write(tmp_path / "i.json", calc_repo.record())) == "swe-bench"
    (tmp_path / "only-instruction").mkdir()
    (tmp_path / "only-instruction" / "instruction.md").write_text("hi\n")
    with pytest.raises(InvalidTaskError, match=r"has instruction\.md but no task\.toml"):
        detect_format(tmp_path / "only-instruction")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidTaskError, match=r"expected task\.toml \(Harbor\) or task\.yaml \(Terminal-Bench\)"):
        detect_format(tmp_path / "empty")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(InvalidTaskError, match="is not a task; give a task directory"):
        detect_format(tmp_path / "notes.txt")
    with pytest.raises(InvalidTaskError, match="does not exist"):
        load_task(tmp_path / "nowhere")


def test_fixture_suite_loads_completely() -> None:
    with pytest.warns(TaskWarning) as record:
        tasks, problems = load_tasks(FIXTURES)
    assert sorted(Path(str(w.message).split(":", 1)[0]).parent.name for w in record) == ["odd-but-valid"]
    assert problems == []
    assert [(t.id, t.format) for t in tasks] == [
        ("count-lines", "terminal-bench"),
        ("hello-file", "harbor"),
        ("legacy-descriptions", "terminal-bench"),
        ("multi-step", "harbor"),
        ("odd-but-valid", "harbor"),
        ("swebench-style", "terminal-bench"),
    ]
    single, problems = load_tasks(FIXTURES / "harbor" / "hello-file")  # a task directory itself
    assert [t.id for t in single] == ["hello-file"] and problems == []


def _suite(tmp_path: Path, calc_repo: CalcRepo) -> Path:
    """Good tasks, nested a level down, next to one bad task of every kind."""
    suite = tmp_path / "suite"
    shutil.copytree(FIXTURES / "harbor" / "hello-file", suite / "harbor" / "hello-file")
    shutil.copytree(FIXTURES / "terminal-bench" / "count-lines", suite / "tb" / "count-lines")
    bad_toml = suite / "harbor" / "bad-toml"
    shutil.copytree(FIXTURES / "harbor" / "hello-file", bad_toml)
    (bad_toml / "task.toml").write_text("[agent\ntimeout_sec = 1\n")
    no_tests = suite / "harbor" / "no-tests"
    shutil.copytree(FIXTURES / "harbor" / "hello-file", no_tests)
    shutil.rmtree(no_tests / "tests")
    wrong_type = suite / "tb" / "wrong-type"
    shutil.copytree(FIXTURES / "terminal-bench" / "count-lines", wrong_type)
    (wrong_type / "task.yaml").write_text("instruction: hi\nmax_agent_timeout_sec: [1]\n")
    (suite / "tb" / "half-written").mkdir()
    (suite / "tb" / "half-written" / "instruction.md").write_text("todo\n")
    # A duplicate id in another group.
    shutil.copytree(FIXTURES / "harbor" / "hello-file", suite / "more" / "hello-file")
    # SWE-bench instances at the top level, one of them bad; the mirror must not be searched for tasks.
    shutil.copytree(calc_repo.mirror, suite / "repos")
    calc_repo.write(
        suite / "swe.jsonl", calc_repo.record(), calc_repo.record(instance_id="acme__calc-2", base_commit="0" * 40)
    )
    (suite / "manifest.json").write_text(json.dumps({"name": "not instances"}))  # not SWE-bench: skipped
    (suite / "docs" / "deep" / "er" / "still" / "hidden").mkdir(parents=True)
    return suite


def test_a_set_with_bad_tasks_returns_the_good_ones_and_every_problem(tmp_path: Path, calc_repo: CalcRepo) -> None:
    tasks, problems = load_tasks(_suite(tmp_path, calc_repo))
    assert [t.id for t in tasks] == ["acme__calc-1", "count-lines", "hello-file"]
    assert all(isinstance(p, TaskProblem) for p in problems)
    by_name = {Path(p.path).name: p.problem for p in problems}
    assert set(by_name) == {"bad-toml", "no-tests", "wrong-type", "half-written", "hello-file", "swe.jsonl"}
    assert "is not valid TOML" in by_name["bad-toml"]
    assert "tests/test.sh is missing" in by_name["no-tests"]
    assert "max_agent_timeout_sec must be a number of seconds" in by_name["wrong-type"]
    assert "no task.toml" in by_name["half-written"]
    assert "task id 'hello-file' is also used by" in by_name["hello-file"]
    assert "is not in" in by_name["swe.jsonl"]
    for path, problem in problems:  # unpacks as (path, problem); the message names the path
        assert str(path) in problem


def test_missing_path_and_a_bad_instance_file(tmp_path: Path) -> None:
    tasks, problems = load_tasks(tmp_path / "nowhere")
    assert tasks == [] and problems == [TaskProblem(tmp_path / "nowhere", f"{tmp_path / 'nowhere'}: does not exist")]
    (tmp_path / "broken.jsonl").write_text("{not json\n")
    tasks, problems = load_tasks(tmp_path)
    assert tasks == [] and len(problems) == 1 and "broken.jsonl:1: is not valid JSON" in problems[0].problem
