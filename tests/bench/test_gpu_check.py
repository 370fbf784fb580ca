"""``scripts/gpu-check.sh`` and ``python -m sandrl.bench.gpu_check``: the GPU check's code path, run here on the CPU.

No GPU is at hand in CI: ``--tiny`` runs the same trainer, steps, plan and log-prob comparison on a
small model on the CPU, through the script as a GPU machine runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from importlib import metadata
from pathlib import Path

from sandrl.bench.gpu_check import requirements

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-check.sh"


def _script(tmp_path: Path, python: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": python, "OUT": str(tmp_path / "out"), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=300, check=False
    )


def test_the_script_runs_the_tiny_check_and_prints_one_json_line(tmp_path: Path) -> None:
    r = _script(tmp_path, sys.executable, "--tiny")
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert len(lines) == 1, r.stdout
    result = json.loads(lines[0])
    assert (tmp_path / "out" / "gpu-check.json").read_text() == lines[0] + "\n"
    assert result["check"] == "gpu" and result["model"]["parameters"] > 0
    for side in ("full", "lora"):
        row = result[side]
        assert row["tokens_per_s"] > 0 and 0 < row["mfu"] < 1 and row["tokens_per_step"] > 0
        assert row["peak_bytes"] > 0 and row["plan_bytes"] == sum(row["plan_terms"].values()) > 0
    assert result["lora"]["plan_terms"]["optimizer state"] < result["full"]["plan_terms"]["optimizer state"]
    agreement = result["agreement"]
    assert agreement["tokens"] == 2 * 31
    # bf16 against float32 on the same weights: rounding, far below what other weights would give.
    assert 0 < agreement["max_abs_diff"] < 0.05 < agreement["fp32_logprob_std"]
    assert result["goal_mfu"] == 0.4 and result["met_mfu"] is False


def test_the_script_says_in_one_json_line_why_it_cannot_run(tmp_path: Path) -> None:
    r = _script(tmp_path, str(tmp_path / "no-such-python"))
    assert r.returncode == 1
    error = f"no {tmp_path}/no-such-python on this machine: set PYTHON to the Python that has PyTorch"
    assert json.loads(r.stdout) == {"check": "gpu", "error": error}
    assert (tmp_path / "out" / "gpu-check.json").read_text() == r.stdout
    bare = tmp_path / "bare"
    venv.create(bare, with_pip=False)  # a Python without torch
    r = _script(tmp_path, str(bare / "bin" / "python"))
    assert r.returncode == 1 and "has no torch" in json.loads(r.stdout)["error"]


def test_the_wheels_it_needs_are_pinned_as_installed_here_and_leave_torch_to_the_machine() -> None:
    pins = dict(line.split("==") for line in requirements())
    assert pins["transformers"] == metadata.version("transformers")
    assert pins["peft"] == metadata.version("peft")
    assert {"huggingface-hub", "safetensors", "tokenizers", "rich", "httpx", "zstandard", "pyyaml"} <= pins.keys()
    assert not {"torch", "numpy", "filelock", "sympy", "triton"} & pins.keys()
