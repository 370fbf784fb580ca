"""A training rank killed mid-run, through ``sandrl train --nproc 2`` as a user runs it: one clear line,
and the same command resumes with each step, and each saved group, trained once. The resumed command runs
by its entry point in this process (:func:`tests.entry_point.run_sandrl`), its ranks processes of their own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ..entry_point import run_sandrl
from .conftest import write_saved_groups

SANDRL = Path(sys.executable).with_name("sandrl")
CONFIG = """
[run]
output_dir = "runs/x"
steps = 3
groups_per_step = 1
checkpoint_every = 1

[tasks]
family = "echo"

[train]
processes = 2
"""


def _ranks(pid: int) -> list[int]:
    """The training ranks the command started (its spawned children)."""
    children = [int(c) for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()]
    return [c for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]


def test_a_killed_rank_stops_the_run_in_one_line_and_the_same_command_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "run.toml").write_text(CONFIG)
    write_saved_groups(tmp_path / "saved.jsonl", groups=3)
    command = [str(SANDRL), "train", "run.toml", "--load-rollouts", "saved.jsonl"]
    run = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert run.stderr is not None
    seen = []
    for line in run.stderr:
        seen.append(line)
        if line.startswith("step 1/3"):  # the next call to the ranks is step 1's checkpoint, or step 2
            ranks = _ranks(run.pid)
            assert len(ranks) == 2, seen
            os.kill(ranks[-1], signal.SIGKILL)
            break
    _, rest = run.communicate(timeout=120)
    assert run.returncode == 2, "".join(seen) + rest
    error = [line for line in rest.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "Traceback" not in rest, rest
    assert "training rank 1 of 2 died (exit code -9) during " in error[0]
    assert "Rerun the same command to resume from the last checkpoint" in error[0]

    resumed = run_sandrl(command[1:], cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys)
    assert resumed.returncode == 0, resumed.stderr
    lines = [json.loads(line) for line in (tmp_path / "runs" / "x" / "metrics.jsonl").read_text().splitlines()]
    # Each step once (a line written before the kill but not checkpointed is dropped), each group once.
    assert [m["step"] for m in lines] == [1, 2, 3]
    assert [m["data_position"] for m in lines] == [1, 2, 3]
    assert [m["samples_trained"] for m in lines] == [2] * 3
    assert [m["total_episodes"] for m in lines] == [2, 4, 6]
    assert all(m["rss_ranks_mb"] > 0 for m in lines)  # the ranks' memory, beside the driver's
