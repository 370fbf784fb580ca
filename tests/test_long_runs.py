"""Long runs as a user meets them (#44): progress a log can read, and stops that keep what was done.

Each test runs the real ``sandrl train`` or ``sandrl eval`` in a subprocess, on real sandboxes,
with tasks whose verifier takes a second (so a step is still running when the test looks at it):

- stderr piped (a Slurm log): progress lines come while a step runs, not only at its end;
- stderr a terminal: the step's bar is drawn while it runs;
- SIGTERM and SIGINT mid-run: one line ``interrupted: ...`` saying what was saved and how to go
  on, exit 128 + the signal, and nothing left on the host: no sandbox record, no cgroup, no process
  of the run; the same command then resumes from the checkpoint and finishes.

The interrupted command is a process of its own; the one that goes on after it runs by its entry point in
this process (:func:`tests.entry_point.run_sandrl`), sparing a new process's seconds of imports.
"""

from __future__ import annotations

import json
import os
import pty
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sandrl.progress import EVERY_ENV as PROGRESS_ENV
from sandrl.sandbox.bwrap.cgroups import CgroupManager
from sandrl.sandbox.bwrap.inventory import survey
from sandrl.sandbox.bwrap.state import StateDir

from .entry_point import run_sandrl
from .support import needs_sandbox

pytestmark = needs_sandbox

SANDRL = Path(sys.executable).with_name("sandrl")
VERIFY_S = 1.0
"""How long each episode's verifier takes: a step lasts at least this long."""
WAIT_S = 120.0
"""The most any line is waited for (a loaded CI box starts a Python process slowly)."""
STEPS = 2
ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
"""A terminal's control sequences (rich's cursor moves and styles), which a reader of the screen does not see."""


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One store for the module: the tasks' image is built once."""
    return tmp_path_factory.mktemp("long-runs-state")


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A working directory with two slow tasks in ``tasks/`` and a run config ``run.toml``."""
    for i in range(2):
        task = tmp_path / "tasks" / f"slow-{i}"
        (task / "environment").mkdir(parents=True)
        (task / "tests").mkdir()
        (task / "environment" / "Dockerfile").write_text("FROM host\nWORKDIR /workspace\n")
        (task / "instruction.md").write_text("Write anything into /workspace/answer.txt.\n")
        (task / "tests" / "test.sh").write_text(
            "#!/bin/bash\nmkdir -p /logs/verifier\n"
            f"sleep {VERIFY_S}\necho $((RANDOM % 2)) > /logs/verifier/reward.txt\n"  # a reward signal, slowly
        )
        (task / "task.toml").write_text(
            'version = "1.0"\n[agent]\ntimeout_sec = 60.0\n[verifier]\ntimeout_sec = 30.0\n'
            '[environment]\nworkdir = "/workspace"\n'
        )
    (tmp_path / "run.toml").write_text(
        f'[run]\noutput_dir = "runs/x"\nsteps = {STEPS}\ngroups_per_step = 1\ncheckpoint_every = 1\n'
        '[tasks]\npath = "tasks"\n'
        "[rollout]\ngroup_size = 2\nconcurrency = 2\nmax_turns = 1\nmax_new_tokens = 8\n"
    )
    return tmp_path


def env(state_dir: Path) -> dict[str, str]:
    return {**os.environ, "SANDRL_STATE_DIR": str(state_dir), PROGRESS_ENV: "0.3"}


class Watched:
    """A command's stream, read in a thread line by line (``\\r`` ends a line too: a terminal's redraws)."""

    def __init__(self, read: Callable[[], bytes], close: Callable[[], None]) -> None:
        self.lines: list[str] = []
        self._close = close
        self._changed = threading.Condition()
        self._read = read
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        pending = ""
        while True:
            try:
                chunk = self._read()
            except OSError:  # a pty's reader gets EIO once the child has closed it
                chunk = b""
            if not chunk:
                break
            pending += ESCAPES.sub("", chunk.decode(errors="replace"))
            *done, pending = re.split(r"\r\n|\r|\n", pending)
            with self._changed:
                self.lines.extend(done)
                self._changed.notify_all()
        with self._changed:
            self.lines.append(pending)
            self._changed.notify_all()

    def wait_for(self, pattern: str) -> int:
        """The index of the first line matching ``pattern`` (a regex), waiting for it to come."""
        deadline = time.monotonic() + WAIT_S
        with self._changed:
            while True:
                for i, line in enumerate(self.lines):
                    if re.search(pattern, line):
                        return i
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    raise AssertionError(f"no line matches {pattern!r}; got:\n" + "\n".join(self.lines[-40:]))
                self._changed.wait(left)

    def finish(self) -> list[str]:
        self._thread.join(WAIT_S)
        self._close()
        return [line for line in self.lines if line.strip()]


def start(cwd: Path, state_dir: Path, *args: str, terminal: bool = False) -> tuple[subprocess.Popen[bytes], Watched]:
    """``sandrl ARGS`` in its own session, its stderr watched (a pty's when ``terminal``)."""
    if terminal:
        leader, follower = pty.openpty()
        extra = {"TERM": "xterm", "COLUMNS": "200"}
        proc = subprocess.Popen(
            [str(SANDRL), *args], cwd=cwd, env={**env(state_dir), **extra}, stdout=subprocess.DEVNULL,
            stderr=follower, start_new_session=True,
        )  # fmt: skip
        os.close(follower)
        return proc, Watched(lambda: os.read(leader, 65536), lambda: os.close(leader))
    proc = subprocess.Popen(
        [str(SANDRL), *args], cwd=cwd, env=env(state_dir), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    assert proc.stderr is not None
    return proc, Watched(proc.stderr.read1, proc.stderr.close)  # type: ignore[attr-defined]


def sandrl_here(
    args: list[str], cwd: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> subprocess.CompletedProcess[str]:
    """``sandrl ARGS`` run as :func:`start` runs it, by its entry point in this process, to its end."""
    monkeypatch.setenv(PROGRESS_ENV, env(state_dir)[PROGRESS_ENV])
    return run_sandrl(args, cwd=cwd, monkeypatch=monkeypatch, capsys=capsys, state_dir=state_dir)


def left_behind(state_dir: Path, session: int) -> list[str]:
    """What a finished command left: sandboxes of its store (records, cgroups) and processes of its session."""
    state = StateDir(state_dir)
    found = [f"sandbox {s.id} ({s.state})" for s in survey(state, CgroupManager(subdir=f"sandrl/{state.cgroup_name}"))]
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == session and fields[0] != "Z":  # a zombie is dead: only its parent's reaping is late
            found.append(f"process {stat.parent.name}")
    return found


def steps_in(metrics: Path) -> list[int]:
    return [json.loads(line)["step"] for line in metrics.read_text().splitlines()]


@pytest.mark.parametrize(
    ("signum", "terminal"),
    [
        pytest.param(signal.SIGTERM, False, id="SIGTERM-piped"),
        pytest.param(signal.SIGINT, True, id="Ctrl-C-terminal"),
    ],
)
def test_a_run_shows_its_step_as_it_goes_stops_cleanly_on_a_signal_and_the_same_command_resumes(
    work: Path,
    state_dir: Path,
    signum: signal.Signals,
    terminal: bool,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    proc, stderr = start(work, state_dir, "train", "run.toml", terminal=terminal)
    try:
        # Within step 1, before its line: how many of its episodes finished, then the trainer's work.
        # Piped, that was nothing at all until the run ended (rich draws only on a terminal).
        episodes = stderr.wait_for(r"^step 1/2 episodes")
        assert episodes < stderr.wait_for(r"^step 1/2  reward"), stderr.lines
        if not terminal:
            assert re.search(r"^step 1/2 episodes: \d/2  [\d.]+/s", stderr.lines[episodes]), stderr.lines[episodes]
        # Mid step 2 (its episodes' sandboxes are up, their verifiers sleeping), the signal.
        stderr.wait_for(r"step 2/2 episodes")
        if terminal:
            os.killpg(proc.pid, signum)  # Ctrl-C: the terminal signals the whole foreground process group
        else:
            proc.send_signal(signum)  # a scheduler's SIGTERM: the process it started
        assert proc.wait(WAIT_S) == 128 + signum
    finally:
        proc.kill()
    lines = stderr.finish()
    out = work / "runs" / "x"
    root = out / "checkpoints"
    said = f"interrupted: 1/2 steps, checkpoint step-00000001 in {root}, rerun the same command to resume"
    assert lines[-1] == said, lines[-5:]
    assert "Traceback" not in "\n".join(lines)
    assert left_behind(state_dir, proc.pid) == []
    assert steps_in(out / "metrics.jsonl") == [1]

    again = sandrl_here(["train", "run.toml"], work, state_dir, monkeypatch, capsys)
    assert again.returncode == 0, again.stderr
    assert "step 2/2  reward" in again.stderr and "step 1/2  reward" not in again.stderr
    assert steps_in(out / "metrics.jsonl") == [1, 2]
    assert json.loads(again.stdout.splitlines()[-1])["steps"] == 2


def test_a_piped_eval_says_how_far_it_is_and_sigterm_says_what_it_kept(
    work: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    results = work / "results"
    args = ("eval", "tasks", "--agent", "null", "--samples", "2", "--results-dir", "results")
    proc, stderr = start(work, state_dir, *args)
    try:
        # Piped, rich's bar printed nothing; now a line every $SANDRL_PROGRESS_EVERY_S: done, rate, ETA.
        line = stderr.lines[stderr.wait_for(r"^episodes: ")]
        assert re.fullmatch(r"episodes: \d/4  [\d.]+/s  (ETA \d+s|\d+s so far)( .*)?", line), line
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(WAIT_S) == 128 + signal.SIGTERM
    finally:
        proc.kill()
    lines = stderr.finish()
    kept = (results / "rollouts.jsonl").read_text().splitlines()
    assert lines[-1] == (
        f"interrupted: {len(kept)} episodes finished, their trajectories in results/rollouts.jsonl "
        "(no results.json: the eval did not finish); rerun the same command to evaluate again"
    ), lines[-5:]
    assert (results / "config.json").is_file() and not (results / "results.json").exists()
    assert left_behind(state_dir, proc.pid) == []
    # As the line says: the same command evaluates again, into the same directory.
    again = sandrl_here(list(args), work, state_dir, monkeypatch, capsys)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (results / "results.json").is_file()
    assert len((results / "rollouts.jsonl").read_text().splitlines()) == 4
