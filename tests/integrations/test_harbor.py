"""Harbor itself (in its own Python >= 3.12 virtualenv) running trials on sandrl sandboxes.

``scripts/harbor-env.sh`` makes the virtualenv once (``make test`` and ``make harbor-env`` call it;
this module calls it too, which costs a second when it is there). A built-in task runs as a Harbor
trial with Harbor's own oracle agent (reward 1; the task's real tests, which an untouched workspace fails) in
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

from ..harbor_venv import harbor_venv
from ..sandbox.e2b.conftest import TOKEN
from ..sandbox.e2b.served import free_port, start_service, stop
from ..support import REASON

pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


@pytest.fixture(scope="module")
def venv() -> Path:
    return harbor_venv()


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


def test_harbor_oracle_trial_on_sandrl_scores_1(venv: Path, service: str, tmp_path: Path) -> None:
    task = SUITE_DIR / "git-restore-deleted-file"  # its Dockerfile copies files and runs git: applied in the sandbox
    solved = trial(venv, service, task, "oracle", tmp_path / "oracle")
    assert solved["verifier_result"] == {"rewards": {"reward": 1.0}}
