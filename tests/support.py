"""What the tests that run real sandboxes need from this host, said once."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from sandrl.sandbox.bwrap import BwrapSandbox


def _why_not_runnable() -> str | None:
    if os.geteuid() != 0:
        return "the bwrap backend needs root"
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (apt-get install bubblewrap)"
    return None


REASON = _why_not_runnable()
"""Why real sandboxes cannot run here, or None when they can."""
needs_sandbox = pytest.mark.skipif(REASON is not None, reason=REASON or "")


def agent_host_pid(sandbox: BwrapSandbox) -> int:
    """The host pid of a sandbox's pid 1 (its agent): the process of its cgroup whose innermost pid is 1."""
    for pid in sandbox._group.processes():
        try:
            with open(f"/proc/{pid}/status") as f:
                nspids = next(line.split()[1:] for line in f if line.startswith("NSpid:"))
        except (OSError, StopIteration):
            continue
        if len(nspids) > 1 and nspids[-1] == "1":
            return pid
    raise AssertionError(f"no pid 1 among the processes of sandbox {sandbox.id}")


def host_mounts() -> Counter[str]:
    """The mounts of this process's mount namespace (the host's), one mountinfo line each."""
    return Counter(Path("/proc/self/mountinfo").read_text().splitlines())


def sandbox_mounts_added(before: Counter[str], state_dir: Path) -> list[str]:
    """Mounts that appeared in the host's namespace since ``before`` and could be a sandbox's: under
    its state directory, its staging tree, an overlay or its tmpfs. Another process's unrelated
    mounts (a concurrent test run's) do not count."""
    added = host_mounts() - before
    marks = (str(state_dir), "/tmp/sandrl", " - overlay ", " sandrl ")
    return sorted(line for line in added.elements() if any(mark in line for mark in marks))


def kill_9_after_first_line(script: str) -> str:
    """Run the Python ``script`` (dedented) as a process of its own, wait for the first line it
    prints, then kill it with SIGKILL, as a crash would; that line."""
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    line = child.stdout.readline()
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    child.stdout.close()
    return line
