"""``sandrl tasks pull``: a dataset of Harbor's registry format, fetched with git from a loopback
``git daemon`` serving two task repositories, written as a directory ``sandrl eval`` runs. The commands
run by their entry point in this process (:func:`tests.entry_point.run_sandrl`)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from http.server import HTTPServer, SimpleHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from sandrl.tasks.datasets import find_dataset, pull_dataset
from sandrl.tasks.datasets.fetch import Repository

from ..entry_point import run_sandrl
from ..support import REASON
from .git_server import GitServer, Link, harbor_task

BIG = os.urandom(1 << 20)
"""A file of repository A outside every task's directory: a sparse fetch never brings it."""


Sandrl = Callable[..., subprocess.CompletedProcess[str]]
"""``sandrl ARGS`` in a working directory (its store in ``state/`` there, 200 columns wide), by its entry
point in this process (:func:`tests.entry_point.run_sandrl`); keyword arguments are environment variables."""


@pytest.fixture
def sandrl(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Sandrl:
    def run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
        return run_sandrl(
            args, cwd=cwd, monkeypatch=monkeypatch, capsys=capsys, state_dir=cwd / "state", columns=200, env=env
        )

    return run


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
    server: GitServer, two_repositories: dict[str, str], tmp_path: Path, sandrl: Sandrl
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

    images = ["--images"] if REASON is None else []  # each task's image into the store, after the pull
    r = sandrl(["tasks", "pull", "--registry", url, "demo@1.0", "--json", *images], tmp_path, **cache)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["written"] == 3 and summary["failed"] == [] and summary["repositories"] == 2
    if images:
        assert summary["images"]["failed"] == 0 and summary["images"]["images"] >= 1, summary["images"]
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


def test_a_missing_commit_or_path_is_reported_for_its_task_and_the_rest_is_written(
    server: GitServer, two_repositories: dict[str, str], tmp_path: Path, sandrl: Sandrl
) -> None:
    a = server.url("tasks-a")
    entries = [
        task("alpha", a, two_repositories["a"], "tasks/alpha"),
        task("ghost", a, "0123456789abcdef" * 2 + "01234567", "tasks/beta"),
        task("nowhere", a, two_repositories["a"], "tasks/missing"),
        task("blob", a, two_repositories["a"], "big/blob.bin"),
    ]
    registry(tmp_path / "registry.json", [{"name": "broken", "version": "1", "tasks": entries}])
    (tmp_path / "datasets.toml").write_text('registry = "registry.json"\n')  # beside it: read from there

    r = sandrl(["tasks", "pull", "broken@1"], tmp_path, SANDRL_DATASETS_CONFIG=str(tmp_path / "datasets.toml"))
    assert r.returncode == 1, r.stderr
    assert f"failed ghost: commit {'0123456789abcdef' * 2}01234567 is not in {a}" in r.stderr
    assert f"failed nowhere: path 'tasks/missing' is not in {a} at commit {two_repositories['a'][:12]}" in r.stderr
    assert (
        f"failed blob: big/blob.bin in {a} at {two_repositories['a'][:12]} is a file, not a task directory" in r.stderr
    )
    assert "broken@1: 1/4 tasks in datasets/broken@1" in r.stderr and "Traceback" not in r.stderr
    assert sorted(p.name for p in (tmp_path / "datasets" / "broken@1").iterdir()) == [".sandrl", "alpha"]


def test_a_server_that_will_not_send_a_commit_by_its_id_is_fetched_whole(server: GitServer, tmp_path: Path) -> None:
    old, _ = server.repository("plain", [harbor_task("7"), {"instruction.md": "later\n"}])
    server.start()
    (tmp_path / "gitconfig").write_text("[protocol]\n\tversion = 0\n")  # v0: only advertised tips by id
    dataset = find_dataset(
        [{"name": "d", "version": "1", "tasks": [task("seven", server.url("plain"), old, "")]}], "d", "1", "test"
    )
    with pytest.MonkeyPatch.context() as env:
        env.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "gitconfig"))
        report = pull_dataset(dataset, tmp_path / "out", cache=tmp_path / "cache")
    assert report.failed == [] and server.fetches() == {"plain": 2}  # refused by id, then everything
    assert (tmp_path / "out" / "seven" / "instruction.md").read_text() == "Write 7 into /workspace/answer.txt.\n"


def test_a_branch_is_looked_up_at_every_pull_and_a_changed_dataset_is_rewritten(
    server: GitServer, tmp_path: Path
) -> None:
    server.repository("moving", [{**{f"one/{k}": v for k, v in harbor_task("1").items()}, "two/task.toml": ""}])
    server.start()
    url = server.url("moving")
    out = tmp_path / "out"
    (out / "mine").mkdir(parents=True)  # the user's: never touched

    def pull(*entries: dict[str, Any]) -> Any:
        dataset = find_dataset([{"name": "d", "version": "1", "tasks": list(entries)}], "d", "1", "test")
        return pull_dataset(dataset, out, cache=tmp_path / "cache")

    first = pull(task("one", url, "main", "one"), task("two", url, None, "two"), task("mine", url, None, "x/mine"))
    assert [o.label for o in first.written] == ["one", "two"]
    assert "mine exists and was not written by a pull" in str(first.failed[0].reason)
    server.commit("moving", {"one/instruction.md": "moved on\n"})

    second = pull(task("one", url, "main", "one"))  # "two" is no longer listed
    assert second.failed == [] and second.network_calls >= 1  # the branch is asked for again
    assert (out / "one" / "instruction.md").read_text() == "moved on\n"
    assert second.removed == ["two"] and not (out / "two").exists() and (out / "mine").is_dir()
    manifest = json.loads((out / ".sandrl" / "dataset.json").read_text())
    assert list(manifest["tasks"]) == ["one"] and manifest["tasks"]["one"]["ref"] == "main"
