"""``sandrl tasks`` and ``sandrl images`` end to end: real builds, real sandboxes, the real verifier."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import sandrl.sandbox.bwrap.provider
from sandrl.cli import app
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.tasks.builtin import SUITE_DIR

# Every kind of Dockerfile the suite has: COPY only; COPY to /tmp then RUN that deletes it; RUN only.
SUBSET = (
    "c-fix-compile-errors",
    "data-json-to-csv-jq",
    "fix-flatten-recursion",
    "git-backport-fix",
    "shell-write-linecount-script",
)


@pytest.fixture
def cli_state(provider: BwrapProvider, state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Make the CLI's providers use the test session's state directory."""
    monkeypatch.setattr(sandrl.sandbox.bwrap.provider, "DEFAULT_STATE_DIR", state_dir)
    return state_dir


@pytest.fixture
def subset(tmp_path: Path) -> Path:
    suite = tmp_path / "suite"
    suite.mkdir()
    for name in SUBSET:
        (suite / name).symlink_to(SUITE_DIR / name, target_is_directory=True)
    return suite


def _run(args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(app, args, catch_exceptions=False, env={"COLUMNS": "200"})
    return result.exit_code, result.output


@pytest.mark.parametrize(("agent", "reward"), [("oracle", 1.0), ("null", 0.0)])
def test_tasks_run_scores(cli_state: Path, subset: Path, agent: str, reward: float) -> None:
    code, output = _run(["tasks", "run", str(subset), "--agent", agent, "--concurrency", "2", "--json"])
    assert code == 0, output
    summary = json.loads(output.strip().splitlines()[-1])
    assert summary["tasks"] == len(SUBSET) and summary["errors"] == 0
    assert summary["pass_rate"] == reward
    assert {r["task"]: r["reward"] for r in summary["results"]} == dict.fromkeys(SUBSET, reward)
    assert all(r["image"].startswith(f"task-{r['task']}-") for r in summary["results"])  # named after its task
    # What sandrl eval records of an episode: its status and, when the task failed, what the verifier said.
    assert {r["status"] for r in summary["results"]} == {"completed"}
    assert all((r["verify_output_tail"] is None) == r["passed"] for r in summary["results"])
    assert all(isinstance(r["verify_exit_code"], int) for r in summary["results"])
    # Why each failed task failed, as it finished: the verifier's exit code and the end of what it said.
    for r in summary["results"]:
        assert (r["reason"] is None) == r["passed"]
        if not r["passed"]:
            assert r["reason"].startswith(f"verifier exit {r['verify_exit_code']}")
            assert f"fail {r['task']} (reward 0): verifier exit" in output


def test_tasks_list(subset: Path) -> None:
    code, output = _run(["tasks", "list", str(subset)])
    assert code == 0, output
    assert "5 tasks, 0 problems" in output and "git-backport-fix" in output


def test_images_build_ls_rm(cli_state: Path, tmp_path: Path) -> None:
    (tmp_path / "hello.txt").write_text("hi\n")
    (tmp_path / "Dockerfile").write_text("FROM host\nCOPY hello.txt /opt/\nRUN cat /opt/hello.txt\n")
    code, output = _run(["images", "build", "cli-img", "-f", str(tmp_path / "Dockerfile")])
    assert code == 0, output
    assert "built cli-img: 3 steps, 0 cached, 2 built" in output
    code, output = _run(["images", "ls"])
    assert code == 0 and "cli-img" in output and "build-" not in output.split("cache images")[0]
    code, output = _run(["images", "rm", "cli-img", "--no-prune"])
    assert code == 0 and "removed 1 images" in output


@pytest.mark.slow
def test_validate_whole_builtin_suite(cli_state: Path) -> None:
    """Every built-in task builds, fails untouched and passes after its oracle (about 20 s on 2 cores)."""
    code, output = _run(["tasks", "validate", str(SUITE_DIR), "--concurrency", "2"])
    assert code == 0, output
    assert "36/36 tasks valid, 0 failed, 0 did not load" in output.replace("\n", " ")
