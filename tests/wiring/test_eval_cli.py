"""``sandrl eval`` for research, as a user runs it: the per-task pass@k table, the failures
grouped by why, the results directory, and the task filters (real sandboxes). The command runs by its
entry point in this process (:func:`tests.entry_point.run_sandrl`: a subprocess spent seconds on its imports
alone); ``tests/test_long_runs.py`` runs ``sandrl eval`` as a process of its own."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from itertools import combinations
from math import comb
from pathlib import Path

import pytest

from sandrl.inference.tokenizer import ByteTokenizer
from sandrl.rollout import read_jsonl
from sandrl.wiring.config import RolloutConfig
from sandrl.wiring.eval_report import REASON_CHARS, pass_at_k, shown_text
from sandrl.wiring.evaluate import EvalConfig, select_tasks
from sandrl.wiring.tasks import load_task_set

from ..entry_point import run_sandrl
from ..support import needs_sandbox

HOSTILE = "[bold red]AssertionError[/] expected [section] got [/]"
"""What the failing task's verifier prints: markup-like text, to be shown as it is."""


Sandrl = Callable[[list[str], Path], subprocess.CompletedProcess[str]]
"""``sandrl ARGS`` in a working directory, its store in ``state/`` there, 200 columns wide."""


@pytest.fixture
def sandrl(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Sandrl:
    def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
        return run_sandrl(args, cwd=cwd, monkeypatch=monkeypatch, capsys=capsys, state_dir=cwd / "state", columns=200)

    return run


def write_task(root: Path, name: str, verifier: str) -> None:
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "task.toml").write_text("[verifier]\ntimeout_sec = 30.0\n")
    (task / "instruction.md").write_text("Nothing to do.\n")
    (task / "environment" / "Dockerfile").write_text("FROM host\nWORKDIR /workspace\n")
    (task / "tests" / "test.sh").write_text(f"mkdir -p /logs/verifier\n{verifier}\n")


@pytest.fixture
def tasks(tmp_path: Path) -> Path:
    """Two tasks every episode passes, one every episode fails, printing :data:`HOSTILE`."""
    root = tmp_path / "tasks"
    write_task(root, "good-a", "echo 1 > /logs/verifier/reward.txt")
    write_task(root, "good-b", "echo 1 > /logs/verifier/reward.txt")
    write_task(
        root, "bad", f"echo '{HOSTILE}'\nprintf '\\033[2Jcleared\\n'\necho 0 > /logs/verifier/reward.txt\nexit 1"
    )
    return root


def test_pass_at_k_is_the_unbiased_estimator() -> None:
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2)
    assert pass_at_k(5, 0, 5) == 0.0 and pass_at_k(5, 1, 5) == 1.0 and pass_at_k(3, 3, 1) == 1.0
    # By its definition: the share of the k-subsets of the n samples holding at least one pass.
    for n in range(1, 7):
        for c in range(n + 1):
            outcomes = [True] * c + [False] * (n - c)
            for k in range(1, n + 1):
                hits = sum(any(s) for s in combinations(outcomes, k))
                assert pass_at_k(n, c, k) == pytest.approx(hits / comb(n, k))
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(3, 4, 1)


@needs_sandbox
def test_eval_prints_pass_at_k_per_task_and_groups_the_failures(tasks: Path, tmp_path: Path, sandrl: Sandrl) -> None:
    out = tmp_path / "results"
    r = sandrl(["eval", str(tasks), "--agent", "null", "--samples", "3", "--results-dir", str(out)], tmp_path)
    assert r.returncode == 0, r.stderr
    cells = [[c.strip() for c in line.strip("│ ").split("│")] for line in r.stderr.splitlines() if line[:1] == "│"]
    rows = {row[0]: row[1:] for row in cells}
    # samples, passed, errors, mean reward, pass@1, pass@3
    assert rows["good-a"] == ["3", "3", "0", "1.000", "1.000", "1.000"]
    assert rows["bad"] == ["3", "0", "0", "0.000", "0.000", "0.000"]
    assert rows["mean of 3 tasks"][-2:] == ["0.667", "0.667"]
    assert "pass@3" in r.stderr
    # The three failures are one reason, counted once, and what the verifier printed is shown as it is.
    assert f"x3 (1 task: bad): verifier exit 1: {HOSTILE} | \\x1b[2Jcleared" in r.stderr
    assert "\x1b" not in r.stderr  # a terminal escape from the sandbox is shown, not sent to the terminal
    assert "3 episodes did not pass, for 1 distinct reason:" in r.stderr
    line = json.loads(r.stdout.strip().splitlines()[-1])
    assert line["pass@1"] == pytest.approx(2 / 3) and line["pass@3"] == pytest.approx(2 / 3)
    assert line["rss_peak_mb"] > 0  # the eval's own memory at its peak
    assert "view: sandrl view " in r.stderr  # where its page is, said at the start
    results = json.loads((out / "results.json").read_text())
    assert {t["task"]: (t["pass@1"], t["pass@3"]) for t in results["tasks"]} == {
        "bad": (0.0, 0.0),
        "good-a": (1.0, 1.0),
        "good-b": (1.0, 1.0),
    }
    reason = f"verifier exit 1: {HOSTILE} | \\x1b[2Jcleared"
    assert results["failures"] == [{"reason": reason, "episodes": 3, "tasks": ["bad"]}]


@needs_sandbox
def test_eval_writes_its_config_and_results_under_runs_eval_by_default(
    tasks: Path, tmp_path: Path, sandrl: Sandrl
) -> None:
    r = sandrl(["eval", str(tasks), "--agent", "null", "--task", "good-a"], tmp_path)
    assert r.returncode == 0, r.stderr
    (run_dir,) = (tmp_path / "runs" / "eval").iterdir()
    assert json.loads(r.stdout.strip().splitlines()[-1])["results_dir"] == str(Path("runs") / "eval" / run_dir.name)
    config = json.loads((run_dir / "config.json").read_text())
    assert config["tasks"] == str(tasks) and config["agent"] == "null" and config["task_pattern"] == "good-a"
    # Options left unset are [rollout]'s defaults, one set for train and eval.
    defaults = RolloutConfig()
    for key in ("max_turns", "max_total_tokens", "max_new_tokens", "temperature", "concurrency"):
        assert config["rollout"][key] == getattr(defaults, key), key
    assert json.loads((run_dir / "results.json").read_text())["tasks"][0]["task"] == "good-a"
    assert len((run_dir / "rollouts.jsonl").read_text().splitlines()) == 1
    # A second eval gets a directory of its own; an explicit one holding results is not overwritten.
    r = sandrl(["eval", str(tasks), "--agent", "null", "--task", "good-a"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert len(list((tmp_path / "runs" / "eval").iterdir())) == 2
    r = sandrl(["eval", str(tasks), "--task", "good-a", "--results-dir", str(run_dir)], tmp_path)
    assert r.returncode == 2 and "holds an earlier eval's results" in r.stderr and "Traceback" not in r.stderr


@needs_sandbox
def test_eval_task_limit_and_seed_choose_the_tasks(tasks: Path, tmp_path: Path, sandrl: Sandrl) -> None:
    def evaluated(*args: str) -> list[str]:
        r = sandrl(["eval", str(tasks), "--agent", "null", "--results-dir", str(tmp_path / "r"), *args], tmp_path)
        assert r.returncode == 0, r.stderr
        results = json.loads((tmp_path / "r" / "results.json").read_text())
        for name in ("results.json", "config.json", "rollouts.jsonl"):
            (tmp_path / "r" / name).unlink()
        return [t["task"] for t in results["tasks"]]

    assert evaluated("--task", "good-*") == ["good-a", "good-b"]
    assert evaluated("--task", "good-*", "--limit", "1", "--seed", "3") == [chosen(tasks, "good-*", 1, 3)]
    r = sandrl(["eval", str(tasks), "--task", "nothing-*"], tmp_path)
    assert r.returncode == 2 and "--task 'nothing-*' matches none of the 3 tasks" in r.stderr
    r = sandrl(["eval", str(tasks), "--limit", "0"], tmp_path)
    assert r.returncode == 2 and "--limit must be at least 1" in r.stderr


def chosen(root: Path, pattern: str | None, limit: int, seed: int) -> str:
    loaded = load_task_set(root)
    (task,) = select_tasks(loaded, EvalConfig(str(root), task_pattern=pattern, limit=limit, seed=seed))
    return task.id


def test_a_failure_reason_is_shown_on_one_bounded_line_of_printable_text() -> None:
    assert shown_text("a\n\tb\x1b[2J\x07c") == "a b\\x1b[2J\\x07c"
    long = shown_text("x" * 1000)
    assert len(long) == REASON_CHARS and long.endswith("...")
    assert len(shown_text("\x1b" * REASON_CHARS)) == REASON_CHARS  # escapes lengthen; the bound holds


def test_limit_is_a_sample_drawn_with_the_seed(tasks: Path) -> None:
    picks = [chosen(tasks, None, 1, seed) for seed in range(8)]
    assert picks == [chosen(tasks, None, 1, seed) for seed in range(8)]  # the same seed, the same tasks
    assert len(set(picks)) > 1  # not always the first


@needs_sandbox
def test_eval_with_a_run_config_evaluates_as_the_run_trained(tasks: Path, tmp_path: Path, sandrl: Sandrl) -> None:
    run_config = tmp_path / "train.toml"
    run_config.write_text(
        '[model]\nname = "tiny"\ninference = "embedded"\n\n'
        f'[tasks]\npath = "{tasks}"\n\n'
        '[rollout]\ngroup_size = 2\nmax_turns = 1\nmax_new_tokens = 8\ntemperature = 0.5\nformat = "tools"\n'
        'system_prompt = "Answer in one command."\n\n'
        "[rollout.timeouts]\nsetup_timeout_s = 45.0\n"
    )
    out = tmp_path / "results"
    r = sandrl(
        ["eval", str(tasks), "--config", str(run_config), "--task", "good-a", "--results-dir", str(out)], tmp_path
    )
    assert r.returncode == 0, r.stderr
    config = json.loads((out / "config.json").read_text())
    # The run's agent and policy, and every episode setting it trained with, unless an option says otherwise.
    assert (config["agent"], config["model"], config["inference"]) == ("llm", "tiny", "embedded")
    rollout = config["rollout"]
    assert (rollout["max_turns"], rollout["max_new_tokens"], rollout["temperature"]) == (1, 8, 0.5)
    assert rollout["format"] == "tools" and rollout["system_prompt"] == "Answer in one command."
    assert rollout["timeouts"]["setup_timeout_s"] == 45.0
    assert rollout["group_size"] == 1  # --samples, not the run's group size: pass@k is eval's to choose
    (episode,) = read_jsonl(out / "rollouts.jsonl")
    assert episode.agent == "llm" and episode.num_turns == 1 and episode.stop_reason == "max_turns"
    assert "Answer in one command." in ByteTokenizer().decode(episode.ids[: episode.prompt_len])
    r = sandrl(
        ["eval", str(tasks), "--config", str(run_config), "--task", "good-a", "--agent", "null", "--max-turns", "3"],
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    (run_dir,) = (tmp_path / "runs" / "eval").iterdir()
    config = json.loads((run_dir / "config.json").read_text())
    assert config["agent"] == "null" and config["rollout"]["max_turns"] == 3 and config["rollout"]["temperature"] == 0.5


@needs_sandbox
def test_tasks_run_shows_a_verifiers_output_as_text_never_markup_or_terminal_escapes(
    tasks: Path, tmp_path: Path, sandrl: Sandrl
) -> None:
    r = sandrl(["tasks", "run", str(tasks), "--agent", "null", "--concurrency", "3"], tmp_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout + r.stderr
    assert "\x1b[2J" not in out and "\\x1b[2Jcleared" in out  # shown, never sent to the terminal
    assert "[bold red]AssertionError[/]" in out  # the words as printed, not styled away
