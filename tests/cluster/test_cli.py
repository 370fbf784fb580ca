"""``sandrl train --ray`` as a user runs it, and the promise that nothing imports Ray without it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from sandrl.inference.engine import Engine

from ..support import needs_sandbox
from .conftest import SANDRL, SandboxHost

TINY_RUN = """
[run]
output_dir = "{out}"
steps = {steps}
groups_per_step = 1

[model]
name = "tiny"
inference = "{inference}"
token_file = "{token_file}"

[tasks]
family = "echo"
count = 2

[rollout]
group_size = 2
concurrency = 4
max_turns = 1
max_new_tokens = 8
"""

NO_RAY = """
import sys
import sandrl.cli
import sandrl.bench.cluster, sandrl.cluster.fleet, sandrl.cluster.training
from sandrl.cli import app
app(["train", sys.argv[1], "--rollout-only"], standalone_mode=False)
print("RAY_MODULES", sorted(m for m in sys.modules if m == "ray" or m.startswith("ray.")))
"""


@needs_sandbox
def test_neither_the_cli_nor_a_train_run_imports_ray_without_the_flag(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text(TINY_RUN.format(out=tmp_path / "out", steps=1, inference="embedded", token_file=""))
    env = {**os.environ, "SANDRL_STATE_DIR": str(tmp_path / "state")}
    r = subprocess.run(
        [sys.executable, "-c", NO_RAY, str(config)], capture_output=True, text=True, env=env, timeout=240
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "RAY_MODULES []" in r.stdout, r.stdout[-2000:]
    assert (tmp_path / "out" / "rollouts.jsonl").read_text().count("\n") == 2


def test_sandrl_train_ray_runs_the_config_as_written(
    tmp_path: Path,
    ray_cluster: Any,
    both_up: dict[str, SandboxHost],
    served: tuple[Engine, str],
    inference_token_file: Path,
) -> None:
    _, url = served
    hosts = "".join(
        f'\n[[cluster.hosts]]\nurl = "{h.url}"\nname = "{h.name}"\n'
        f'token_file = "{h.token_file}"\ncapacity = {h.capacity}\n'
        for h in both_up.values()
    )
    config = tmp_path / "cluster.toml"
    cluster = "\n[cluster]\nworkers = 2\nworker_cpus = 0.5\ntrainer_threads = 1\n"
    run = TINY_RUN.format(out="out", steps=2, inference=url, token_file=inference_token_file)
    config.write_text(run + cluster + hosts)
    r = subprocess.run(
        [str(SANDRL), "train", str(config), "--ray", ray_cluster.address, "--mode", "sync"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,  # output_dir "out" is relative to the working directory
    )
    assert r.returncode == 0, r.stderr[-3000:]
    last = json.loads(r.stdout.strip().splitlines()[-1])
    assert last["step"] == 2 and last["total_episodes"] == 4 and last["total_infra_errors"] == 0
    c = last["cluster"]
    assert set(c["hosts"]) == {"a", "b"} and c["ledger"]["episodes_delivered"] == 4
    out = tmp_path / "out"
    assert (out / "cluster.toml").is_file() and (out / "cluster.json").is_file() and (out / "checkpoints").is_dir()
    token = next(iter(both_up.values())).token_file.read_text().strip()
    assert token not in (out / "cluster.toml").read_text() + (out / "cluster.json").read_text()
