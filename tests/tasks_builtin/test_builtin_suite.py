"""The built-in task suite and the generated task families, checked for real in bubblewrap.

Every built-in task must score 0 untouched and 1 after its oracle (``check_suite.py``). The whole
suite takes about 20-30 s on two cores, so it runs in full, in parallel, once per session.
"""

from __future__ import annotations

import os
import shutil
import tomllib
from pathlib import Path

import pytest

from sandrl.tasks.builtin import SUITE_DIR, task_dirs
from sandrl.tasks.builtin.generated import FAMILIES, generate_tasks

from . import check_suite

needs_bwrap = pytest.mark.skipif(
    not Path(check_suite.BWRAP).exists() or os.geteuid() != 0,
    reason="needs bubblewrap, run as root",
)
TASKS = task_dirs()


@pytest.fixture(scope="module")
def suite_results() -> dict[str, check_suite.Result]:
    results = check_suite.check_suite(TASKS, jobs=os.cpu_count() or 1)
    return {r.name: r for r in results}


def test_suite_size_and_spread() -> None:
    assert check_suite.find_tasks(SUITE_DIR) == TASKS
    assert len(TASKS) >= 30
    categories: dict[str, int] = {}
    for task in TASKS:
        category = tomllib.loads((task / "task.toml").read_text())["metadata"]["category"]
        categories[category] = categories.get(category, 0) + 1
    assert len(categories) >= 5, categories


@pytest.mark.parametrize("task", TASKS, ids=[t.name for t in TASKS])
def test_layout(task: Path) -> None:
    assert check_suite.check_layout(task) == []
    for script in ("tests/test.sh", "solution/solve.sh"):
        assert os.access(task / script, os.X_OK), script


@needs_bwrap
@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS, ids=[t.name for t in TASKS])
def test_task_scores_0_then_1(task: Path, suite_results: dict[str, check_suite.Result]) -> None:
    result = suite_results[task.name]
    assert result.ok, "\n".join(result.problems) + "\n" + result.log[-4000:]


def tree(root: Path) -> dict[str, tuple[int, bytes]]:
    return {
        str(p.relative_to(root)): (p.stat().st_mode, p.read_bytes() if p.is_file() else b"")
        for p in sorted(root.rglob("*"))
    }


@pytest.mark.parametrize("family", FAMILIES)
def test_generated_deterministic(family: str, tmp_path: Path) -> None:
    first = generate_tasks(tmp_path / "a", family, 5, seed=11)
    second = generate_tasks(tmp_path / "b", family, 5, seed=11)
    other = generate_tasks(tmp_path / "c", family, 5, seed=12)
    assert [p.name for p in first] == [f"{family}-11-{i:04d}" for i in range(5)]
    assert [p.name for p in second] == [p.name for p in first]
    assert tree(tmp_path / "a") == tree(tmp_path / "b")
    assert [tree(p) for p in first] != [tree(p) for p in other]
    assert all(check_suite.check_layout(p) == [] for p in first)


def test_generated_refuses_to_overwrite(tmp_path: Path) -> None:
    generate_tasks(tmp_path, "echo", 1, seed=0)
    with pytest.raises(FileExistsError):
        generate_tasks(tmp_path, "echo", 1, seed=0)
    (tmp_path / "echo-0-0000" / "stray").write_text("x")
    generate_tasks(tmp_path, "echo", 1, seed=0, overwrite=True)
    assert not (tmp_path / "echo-0-0000" / "stray").exists()
    with pytest.raises(ValueError):
        generate_tasks(tmp_path, "no-such-family", 1, seed=0)


@needs_bwrap
@pytest.mark.slow
def test_generated_tasks_score_0_then_1(tmp_path: Path) -> None:
    dirs = [d for family in FAMILIES for d in generate_tasks(tmp_path, family, 3, seed=3)]
    results = check_suite.check_suite(dirs, jobs=os.cpu_count() or 1)
    failed = {r.name: r.problems for r in results if not r.ok}
    assert not failed
    shutil.rmtree(tmp_path)


def _near_miss(answer: str) -> str:
    """The answer with its last character changed: one edit away."""
    return answer[:-1] + ("1" if answer[-1] == "0" else "0")


@needs_bwrap
@pytest.mark.parametrize("family", FAMILIES)
def test_generated_partial_credit(family: str, tmp_path: Path) -> None:
    """Word families pay 0.5 x edit-distance closeness for a wrong answer, number families nothing."""
    task = generate_tasks(tmp_path / "tasks", family, 1, seed=5)[0]
    expected = (task / "tests" / "expected.txt").read_text().strip()
    rewards = {}
    for name, answer in {"near": _near_miss(expected), "far": "#" * (2 * len(expected)), "right": expected}.items():
        image = check_suite.build_image(task, tmp_path / name)
        image.host_path("/workspace/answer.txt").write_text(f"  {answer}\n")
        rewards[name], log = check_suite.run_verifier(task, image)
        assert rewards[name] != "missing", log
    assert rewards["right"] == "1"
    if family in ("echo", "reverse"):
        assert float(rewards["near"]) == pytest.approx(0.5 * (1 - 1 / len(expected)), abs=1e-4)
        assert float(rewards["far"]) == 0.0
    else:
        assert rewards["near"] == rewards["far"] == "0"
