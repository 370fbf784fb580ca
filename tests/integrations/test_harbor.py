"""Harbor itself (in its own Python >= 3.12 virtualenv) running trials on sandrl sandboxes.

``scripts/harbor-env.sh`` makes the virtualenv once (``make test`` and ``make harbor-env`` call it;
this module calls it too, which costs a second when it is there). A built-in task runs as a Harbor
trial with Harbor's own oracle agent (reward 1) and its no-op agent (reward 0) in
``sandrl_harbor:SandrlEnvironment``, against a ``sandrl serve sandboxes`` on loopback.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandrl.tasks.builtin import SUITE_DIR

from ..e2b.conftest import TOKEN
from ..e2b.served import free_port, start_service, stop
from ..support import REASON

pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")
ROOT = Path(__file__).resolve().parents[2]
NO_PYTHON = 3
"""scripts/harbor-env.sh's exit status when no Python >= 3.12 exists."""


@pytest.fixture(scope="module")
def harbor_venv() -> Path:
    r = subprocess.run(["bash", str(ROOT / "scripts" / "harbor-env.sh")], capture_output=True, text=True, timeout=900)
    if r.returncode == NO_PYTHON:
        pytest.skip(f"Harbor needs Python >= 3.12 and this machine has none: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    return Path(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    proc = start_service(tmp_path_factory.mktemp("harbor-state"), port)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


def trial(venv: Path, url: str, task: Path, agent: str, trials: Path) -> dict[str, object]:
    env = {**os.environ, "SANDRL_TOKEN": TOKEN, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    args = ["trial", "start", "-p", str(task), "-a", agent, "--trials-dir", str(trials)]
    args += ["-e", "sandrl_harbor:SandrlEnvironment", "--environment-kwarg", f"url={url}"]
    r = subprocess.run([str(venv / "bin" / "harbor"), *args], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    (result_file,) = trials.glob("*/result.json")
    result: dict[str, object] = json.loads(result_file.read_text())
    assert result.get("exception_info") is None, (
        result["exception_info"],
        (result_file.parent / "trial.log").read_text(),
    )
    return result


def test_harbor_oracle_trial_on_sandrl_scores_1_and_nop_0(harbor_venv: Path, service: str, tmp_path: Path) -> None:
    task = SUITE_DIR / "git-restore-deleted-file"  # its Dockerfile copies files and runs git: applied in the sandbox
    solved = trial(harbor_venv, service, task, "oracle", tmp_path / "oracle")
    assert solved["verifier_result"] == {"rewards": {"reward": 1.0}}
    untouched = trial(harbor_venv, service, task, "nop", tmp_path / "nop")
    assert untouched["verifier_result"] == {"rewards": {"reward": 0.0}}
