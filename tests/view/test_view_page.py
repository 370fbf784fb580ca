"""The viewer's page in headless Chromium, on a real short run: its curves, an episode's reply,
command output and verifier output; an episode's ``<script>``, ``<img onerror>`` and ANSI
sequences shown as text, never run; the same for the one-file report (``--out``)."""

from __future__ import annotations

import asyncio
import html
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sandrl.background_server import BackgroundServer
from sandrl.cli import app
from sandrl.inference.base import InferenceClient
from sandrl.inference.tokenizer import ByteTokenizer
from sandrl.rollout import LLMAgent
from sandrl.rollout.agent import AgentResult, Budget
from sandrl.sandbox.base import Sandbox
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.tasks.task import Task
from sandrl.train.command import run_training
from sandrl.train.run_config import from_dict
from sandrl.view.app import create_app
from sandrl.view.run_files import RunFiles
from sandrl.view.run_view import RunView

from ..rollout.conftest import ScriptedPolicy, bash
from ..support import REASON

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
HOSTILE = (
    "printf '%s\\n' '<script>document.title=\"pwned\"</script>' "
    "'<img src=x onerror=\"document.body.dataset.pwned=1\">'; printf '\\033[31mRED\\033[0m\\n'; "
    "echo hello > answer.txt"
)
TEST_SH = """#!/bin/bash
mkdir -p /logs/verifier
echo "VERIFIER-SAYS: checking answer.txt"
reward=0
if [ "$(cat /workspace/answer.txt)" = hello ]; then reward=1; fi
echo $reward > /logs/verifier/reward.txt
"""


def _task(root: Path) -> Path:
    task = root / "tasks" / "hostile-output"
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "task.toml").write_text(
        'version = "1.0"\n\n[verifier]\ntimeout_sec = 30.0\n\n[environment]\nworkdir = "/workspace"\n'
    )
    (task / "instruction.md").write_text("Write hello into /workspace/answer.txt.\n")
    (task / "environment" / "Dockerfile").write_text("FROM host\nWORKDIR /workspace\n")
    (task / "tests" / "test.sh").write_text(TEST_SH)
    return root / "tasks"


@dataclass
class HostileAgent:
    """The LLM agent on a scripted policy (the random tiny model writes no command): every other
    episode runs :data:`HOSTILE` and submits, the others submit at once."""

    name: str = "llm"
    episodes: int = 0

    async def run(self, task: Task, sandbox: Sandbox, policy: InferenceClient | None, budget: Budget) -> AgentResult:
        self.episodes += 1
        replies = [bash(HOSTILE), bash("submit")] if self.episodes % 2 else [bash("submit")]
        return await LLMAgent(ByteTokenizer()).run(task, sandbox, ScriptedPolicy(replies), budget)


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A real run's directory: ``sandrl train``'s driver, real sandboxes, the real trainer, 2 steps."""
    if REASON is not None:
        pytest.skip(REASON)
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (scripts/bootstrap.sh installs it)")
    root = tmp_path_factory.mktemp("view-run")
    config = from_dict(
        {
            "run": {"output_dir": str(root / "out"), "steps": 2, "groups_per_step": 1},
            "tasks": {"path": str(_task(root))},
            "rollout": {"group_size": 2, "max_turns": 3, "max_new_tokens": 400, "max_total_tokens": 4096},
        }
    )
    provider = BwrapProvider(root / "state")
    try:
        asyncio.run(run_training(config, mode="sync", provider=provider, agent=HostileAgent()))
    finally:
        provider._close_all_sync()
    yield root / "out"


def dom(url: str) -> str:
    """The page's DOM after its script ran (headless Chromium)."""
    assert CHROMIUM is not None
    done = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--virtual-time-budget=10000",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def hostile_episode(run_dir: Path) -> int:
    run = RunFiles.open(run_dir)
    run.refresh()
    return run.episodes.passed.index(True)


def check_episode_page(page: str) -> None:
    text = html.unescape(re.sub(r"<[^>]+>", "", page))
    assert 'data-ready="1"' in page  # the page's script ran to the end
    assert "I will run this." in text  # the model's reply
    assert "stdout:" in text and "RED" in text  # the command's output
    assert "VERIFIER-SAYS: checking answer.txt" in text  # the verifier's output
    # The episode's markup is text: escaped in the DOM, no element of it, nothing of it ran.
    assert "&lt;script&gt;document.title" in page and "&lt;img src=x onerror" in page
    assert "<img" not in page and "pwned" not in page.split("<title>")[1].split("</title>")[0]
    assert "data-pwned" not in page
    assert "\\x1b[31mRED" in text and "\x1b" not in page  # ANSI as its escape, not a control character


def test_the_page_of_a_real_run_shows_its_curves_and_reads_an_episode(real_run: Path) -> None:
    view = RunView(RunFiles.open(real_run))
    with BackgroundServer(create_app(view)) as server:
        curves = dom(f"{server.url}/#curves")
        assert 'data-chart="Reward and pass rate"' in curves and "<path" in curves
        n = hostile_episode(real_run)
        check_episode_page(dom(f"{server.url}/#episodes?episode={n}"))
        side = dom(f"{server.url}/#episodes?episode={n}&compare={1 - n}")
        assert side.count('class="episode"') == 2


def test_the_one_file_report_shows_the_same_and_runs_nothing_of_the_episodes(real_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    outcome = CliRunner().invoke(app, ["view", str(real_run), "--out", str(out)])
    assert outcome.exit_code == 0, outcome.output
    report = out.read_text()
    assert "<script>document.title" not in report and "\\u003cscript\\u003e" in report
    check_episode_page(dom(out.as_uri() + f"#episodes?episode={hostile_episode(real_run)}"))
