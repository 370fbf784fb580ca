"""The workloads: deterministic inputs, and every command runs in a real sandbox."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from sandrl.bench import workloads
from sandrl.errors import ConfigError
from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider

from ..support import needs_sandbox


def _tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and ".git" not in p.relative_to(root).parts:
            h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes())
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root / "repo", capture_output=True, text=True, check=True)
    h.update(head.stdout.encode())
    return h.hexdigest()


def test_inputs_are_deterministic(tmp_path: Path) -> None:
    script = Path(workloads.__file__).with_name("workload_inputs.py")
    digests = []
    for name in ("one", "two"):
        subprocess.run([sys.executable, str(script), str(tmp_path / name)], check=True)
        digests.append(_tree_digest(tmp_path / name))
    assert digests[0] == digests[1]


def test_catalogue() -> None:
    assert {w.cls for w in workloads.WORKLOADS} == set(workloads.CLASSES)
    assert all(sum(w.cls == c for w in workloads.WORKLOADS) == 3 for c in workloads.CLASSES)
    quick = workloads.select(workloads.QUICK_NAMES)
    assert {w.cls for w in quick} == set(workloads.CLASSES)
    with pytest.raises(ConfigError, match="no workload named"):
        workloads.select(["nope"])
    with pytest.raises(ConfigError):
        workloads.select([])


@needs_sandbox
async def test_every_workload_runs_in_a_sandbox(provider: BwrapProvider) -> None:
    async with await provider.create(SandboxSpec(ttl_s=600)) as sandbox:
        await workloads.prepare(sandbox)
        standalone = await workloads.measure_standalone(sandbox, workloads.WORKLOADS, warmup=0, repeats=1)
        assert set(standalone) == set(workloads.BY_NAME)
        for s in standalone.values():
            assert s.median_s > 0 and len(s.runs_s) == 1
        pytest_run = await sandbox.exec(workloads.BY_NAME["pytest_suite"].command, cwd=workloads.ROOT)
        assert "500 passed" in pytest_run.stdout
        built = await sandbox.exec("./c/app", cwd=workloads.ROOT)
        assert built.ok and built.stdout.strip().isdigit()
