"""``sandrl tasks pull``: a dataset of Harbor's registry format, fetched with git from a loopback
``git daemon`` serving two task repositories, written as a directory ``sandrl eval`` runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import HTTPServer, SimpleHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from sandrl.tasks.datasets.fetch import Repository

from ..support import REASON
from .git_server import GitServer, Link, harbor_task

SANDRL = Path(sys.executable).with_name("sandrl")
BIG = os.urandom(1 << 20)
"""A file of repository A outside every task's directory: a sparse fetch never brings it."""


def sandrl(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "SANDRL_STATE_DIR": str(cwd / "state"), "COLUMNS": "200", **env}
    return subprocess.run([str(SANDRL), *args], capture_output=True, text=True, env=full, cwd=cwd, timeout=180)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[GitServer]:
    server = GitServer(tmp_path / "srv")
    yield server
    server.stop()


def registry(path: Path, datasets: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps(datasets))
    return path


def task(name: str, url: str, commit: str | None, path: str) -> dict[str, Any]:
    return {"name": name, "git_url": url, "git_commit_id": commit, "path": path}


@pytest.fixture
def two_repositories(server: GitServer) -> dict[str, str]:
    """Repository A holds alpha and beta (pinned to its first commit, not its tip) and a big file
    outside both, and serves partial fetches; B holds gamma and filters nothing."""
    alpha = {f"tasks/alpha/{k}": v for k, v in harbor_task("41").items()}
    alpha["tasks/alpha/tests/solution-link"] = Link("../solution/solve.sh")  # inside the task: kept
    beta = {f"tasks/beta/{k}": v for k, v in harbor_task("42").items()}
    a1, _ = server.repository(
        "tasks-a",
        [{**alpha, **beta, "big/blob.bin": BIG}, {"tasks/alpha/instruction.md": "changed after the pin\n"}],
        config={"uploadpack.allowFilter": "true", "uploadpack.allowAnySHA1InWant": "true"},
    )
    (b1,) = server.repository("tasks-b", [{f"gamma/{k}": v for k, v in harbor_task("43").items()}])
    server.start()
    return {"a": a1, "b": b1}


def test_pull_fetches_each_repository_once_and_the_dataset_runs_with_the_oracle(
    server: GitServer, two_repositories: dict[str, str], tmp_path: Path
) -> None:
    a, b = server.url("tasks-a"), server.url("tasks-b")
    commits = two_repositories
    entries = [
        task("alpha", a, commits["a"], "tasks/alpha"),
        task("beta", a, commits["a"], "tasks/beta/"),
        task("gamma", b, commits["b"], "gamma"),
    ]
    listed = registry(tmp_path / "registry.json", [{"name": "demo", "version": "1.0", "tasks": entries}])
    served = tmp_path / "served"
    served.mkdir()
    (served / "registry.json").write_bytes(listed.read_bytes())
    http = HTTPServer(("127.0.0.1", 0), lambda *a: SimpleHTTPRequestHandler(*a, directory=str(served)))
    threading.Thread(target=http.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{http.server_address[1]}/registry.json"
    cache = {"SANDRL_CACHE_DIR": str(tmp_path / "cache")}

    r = sandrl(["tasks", "pull", "--registry", url, "demo@1.0", "--json"], tmp_path, **cache)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["written"] == 3 and summary["failed"] == [] and summary["repositories"] == 2
    # A: its commits and trees, then the files of both tasks in one request; B ignores the filter: once.
    assert server.fetches() == {"tasks-a": 2, "tasks-b": 1}
    assert summary["network_calls"] == 3
    dataset = tmp_path / "datasets" / "demo@1.0"
    assert sorted(p.name for p in dataset.iterdir()) == [".sandrl", "alpha", "beta", "gamma"]
    assert (dataset / "alpha" / "instruction.md").read_text() == "Write 41 into /workspace/answer.txt.\n"  # the pin
    assert os.readlink(dataset / "alpha" / "tests" / "solution-link") == "../solution/solve.sh"
    assert os.access(dataset / "gamma" / "solution" / "solve.sh", os.X_OK)
    # Sparse: the big file outside the tasks was never fetched.
    git_dir = Repository(tmp_path / "cache" / "datasets", a, 30).git_dir
    held = subprocess.run(["git", "--git-dir", str(git_dir), "count-objects", "-v"], capture_output=True, text=True)
    assert int(held.stdout.split("size-pack: ")[1].split()[0]) < 256, held.stdout  # KiB: without the 1 MiB file

    # The second pull: the git server and the registry's are gone, and nothing is fetched.
    server.stop()
    http.shutdown()
    http.server_close()
    r = sandrl(["tasks", "pull", "--registry", url, "demo@1.0", "--json"], tmp_path, **cache)
    assert r.returncode == 0, r.stderr
    again = json.loads(r.stdout.strip().splitlines()[-1])
    assert again["written"] == 3 and again["from_cache"] == 3 and again["network_calls"] == 0
    assert "using the copy fetched" in r.stderr

    if REASON is None:  # the oracle runs in real sandboxes
        r = sandrl(["eval", str(dataset), "--agent", "oracle", "--results-dir", str(tmp_path / "results")], tmp_path)
        assert r.returncode == 0, r.stderr
        result = json.loads(r.stdout.strip().splitlines()[-1])
        assert result["pass@1"] == 1.0, r.stderr
        tasks = json.loads((tmp_path / "results" / "results.json").read_text())["tasks"]
        assert sorted(t["task"] for t in tasks) == ["alpha", "beta", "gamma"]
