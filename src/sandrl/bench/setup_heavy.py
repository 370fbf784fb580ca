"""Tasks whose setup takes real time, for ``sandrl bench rollout --fork-groups`` and its tests.

Each is a Harbor task of one step whose ``workdir/setup.sh`` stands for an expensive preparation (a
repository checkout, a build): it waits ``wait_s`` (a download), computes a SHA-256 chain of
``rounds`` links in Python (CPU), and writes ``data_mb`` MiB of files the chain determines. The task
asks for the chain's last digest in ``/workspace/answer.txt``; the verifier compares it with the
digest computed when the task was written; the oracle copies it from ``data/digest.txt``, which only
the setup makes. So an episode passes only in a sandbox that was set up, by itself or by its group.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from sandrl.tasks import Task, load_task

SETUP = """#!/bin/bash
# The expensive setup, as a checkout and a build would be: a wait, CPU work, files written.
set -euo pipefail
mkdir -p data
sleep {wait_s}
python3 - <<'PY'
import hashlib
h = b"{seed}"
for _ in range({rounds}):
    h = hashlib.sha256(h).digest()
with open("data/blob.bin", "wb") as f:
    for i in range({data_mb}):
        f.write(hashlib.sha256(h + bytes([i % 256])).digest() * 32768)
with open("data/digest.txt", "w") as f:
    f.write(h.hex() + "\\n")
PY
"""

TEST = """#!/bin/bash
mkdir -p /logs/verifier
if [ "$(tr -d '[:space:]' < /workspace/answer.txt 2>/dev/null)" = "$(tr -d '[:space:]' < /tests/expected.txt)" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""

TOML = """schema_version = "1.4"

[task]
name = "sandrl/{name}"
description = "A task whose setup takes {wait_s} s of waiting and {rounds} hash rounds"

[agent]
timeout_sec = 120.0

[verifier]
timeout_sec = 60.0

[environment]
build_timeout_sec = 60.0
cpus = 1
memory_mb = 512
storage_mb = {storage_mb}
allow_internet = false
workdir = "/workspace"

[[steps]]
name = "prepare"
"""


@functools.cache
def chain_digest(seed: str, rounds: int) -> str:
    """The last link of the setup's SHA-256 chain: the task's answer."""
    h = seed.encode()
    for _ in range(rounds):
        h = hashlib.sha256(h).digest()
    return h.hex()


def write_task(
    root: Path, name: str, *, wait_s: float = 0.0, rounds: int = 1000, data_mb: int = 1, seed: str | None = None
) -> Path:
    """Write the task ``name`` under ``root`` (see the module); its directory. Its chain starts from
    ``seed`` (default: the name); tasks that share one share their answer, computed here once."""
    seed = name if seed is None else seed
    task = root / name
    step = task / "steps" / "prepare"
    for d in (task / "environment", task / "tests", step / "workdir", step / "solution"):
        d.mkdir(parents=True, exist_ok=True)
    (task / "environment" / "Dockerfile").write_text("FROM host\nWORKDIR /workspace\n")
    (task / "task.toml").write_text(
        TOML.format(name=name, wait_s=f"{wait_s:g}", rounds=rounds, storage_mb=max(64, 4 * data_mb + 32))
    )
    (task / "tests" / "test.sh").write_text(TEST)
    (task / "tests" / "expected.txt").write_text(chain_digest(seed, rounds) + "\n")
    (step / "instruction.md").write_text("Write the digest in /workspace/data/digest.txt into /workspace/answer.txt.\n")
    (step / "workdir" / "setup.sh").write_text(
        SETUP.format(wait_s=f"{wait_s:g}", seed=seed, rounds=rounds, data_mb=data_mb)
    )
    (step / "solution" / "solve.sh").write_text("#!/bin/bash\ncp /workspace/data/digest.txt /workspace/answer.txt\n")
    return task


def load_setup_heavy(task_dir: Path) -> Task:
    """Load a task :func:`write_task` wrote."""
    return load_task(task_dir)
