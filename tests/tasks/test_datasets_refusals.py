"""What a dataset registry names is hostile: each entry that would reach outside its repository,
its task directory or the network is refused with its reason, and the rest is written."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandrl.errors import ConfigError, SandrlError, TaskError
from sandrl.tasks.datasets import find_dataset, parse_spec, pull_dataset, read_registry
from sandrl.tasks.datasets.git import check_url

from ..entry_point import run_sandrl
from .git_server import GitServer, Link, harbor_task


@pytest.fixture
def server(tmp_path: Path) -> Iterator[GitServer]:
    server = GitServer(tmp_path / "srv")
    yield server
    server.stop()


def in_dir(prefix: str, files: dict[str, Any]) -> dict[str, Any]:
    return {f"{prefix}/{k}": v for k, v in files.items()}


def test_hostile_entries_are_refused_each_with_its_reason_and_the_rest_is_written(
    server: GitServer, tmp_path: Path
) -> None:
    (good,) = server.repository("good", [in_dir("tasks/good", harbor_task("1"))])
    links = {
        **in_dir("up", {**harbor_task("2"), "tests/leak": Link("../../../../../../etc/passwd")}),
        **in_dir("abs", {**harbor_task("3"), "tests/leak": Link("/etc/passwd")}),
        # Each link alone stays inside; read through the first, the second leaves the task.
        **in_dir("through", {**harbor_task("4"), "a/b/q": Link("../.."), "tests/p": Link("../a/b/q/../..")}),
        **in_dir("inside", {**harbor_task("5"), "tests/ok": Link("../a/../instruction.md"), "a/x": "x"}),
        **in_dir("sub", harbor_task("6")),
        **in_dir(
            "lfs", {**harbor_task("7"), "data.bin": "version https://git-lfs.github.com/spec/v1\noid sha256:00\n"}
        ),
    }
    (evil,) = server.repository("evil", [links], submodules=("sub/vendor",))
    server.start()
    g, e = server.url("good"), server.url("evil")
    pwned = tmp_path / "pwned"
    entries: list[object] = [
        {"name": "good", "git_url": g, "git_commit_id": good, "path": "tasks/good"},
        {"name": "dotdot", "git_url": g, "git_commit_id": good, "path": "../tasks/good"},
        {"name": "dotdot-inside", "git_url": g, "git_commit_id": good, "path": "tasks/../../x"},
        {"name": "absolute", "git_url": g, "git_commit_id": good, "path": "/etc"},
        {"name": "backslash", "git_url": g, "git_commit_id": good, "path": "tasks\\good"},
        {"name": "ext", "git_url": f"ext::sh -c touch% {pwned}", "git_commit_id": good, "path": "x"},
        {"name": "file", "git_url": f"file://{server.base}/good.git", "git_commit_id": good, "path": "tasks/good"},
        {"name": "local-path", "git_url": str(server.base / "good.git"), "git_commit_id": good, "path": "tasks/good"},
        {"name": "ssh", "git_url": "ssh://127.0.0.1/good.git", "git_commit_id": good, "path": "tasks/good"},
        {"name": "option", "git_url": f"{g} --upload-pack=touch", "git_commit_id": good, "path": "tasks/good"},
        {"name": "userinfo", "git_url": "https://u:p@example.invalid/x.git", "git_commit_id": good, "path": "x"},
        {"name": "flag-commit", "git_url": g, "git_commit_id": f"--upload-pack=touch {pwned}", "path": "tasks/good"},
        {"name": "number-commit", "git_url": g, "git_commit_id": 12, "path": "tasks/good"},
        {"name": "../../escape", "git_url": g, "git_commit_id": good, "path": ""},
        {"name": "twice", "git_url": g, "git_commit_id": good, "path": "again/good"},
        {"git_url": g, "git_commit_id": good, "path": "tasks/good"},
        "not an object",
        {"name": "up", "git_url": e, "git_commit_id": evil, "path": "up"},
        {"name": "abs", "git_url": e, "git_commit_id": evil, "path": "abs"},
        {"name": "through", "git_url": e, "git_commit_id": evil, "path": "through"},
        {"name": "inside", "git_url": e, "git_commit_id": evil, "path": "inside"},
        {"name": "sub", "git_url": e, "git_commit_id": evil, "path": "sub"},
        {"name": "lfs", "git_url": e, "git_commit_id": evil, "path": "lfs"},
    ]
    dataset = find_dataset([{"name": "evil", "version": "1", "tasks": entries}], "evil", "1", "test")
    out = tmp_path / "out"
    report = pull_dataset(dataset, out, cache=tmp_path / "cache")

    reasons = {o.label: o.reason for o in report.failed}
    expected = {
        "dotdot": "must be a relative path inside its repository",
        "dotdot-inside": "must be a relative path inside its repository",
        "absolute": "must be a relative path inside its repository",
        "backslash": "no .., not absolute, no backslash",
        "ext": "ext:: runs a command",
        "file": "transport 'file'",
        "local-path": "transport 'local path'",
        "ssh": "transport 'ssh'",
        "option": "holds spaces or control characters",
        "userinfo": "carries a user name or password",
        "flag-commit": "is neither a full commit id nor a branch or tag name",
        "number-commit": "is neither a full commit id nor a branch or tag name",
        "../../escape": "cannot be a directory in the dataset",
        "twice": "its directory 'good' is also 'good''s",
        "task #16": "has no name",
        "task #17": "has no name",
        "up": "symlink 'tests/leak' points out of the task directory",
        "abs": "symlink 'tests/leak' points to the absolute path '/etc/passwd'",
        "through": "symlink 'tests/p' points out of the task directory",
        "sub": "holds a git submodule at 'vendor'",
        "lfs": "'data.bin' is a git-lfs pointer",
    }
    assert set(reasons) == set(expected), reasons
    for label, fragment in expected.items():
        assert fragment in str(reasons[label]), (label, reasons[label])
    assert [o.label for o in report.written] == ["good", "inside"]
    assert sorted(p.name for p in out.iterdir()) == [".sandrl", "good", "inside"]
    assert (out / "inside" / "tests" / "ok").read_text() == "Write 5 into /workspace/answer.txt.\n"
    assert not pwned.exists()
    # Nothing refused by its entry reached the network; a task refused for its files is not stored.
    assert server.fetches() == {"good": 1, "evil": 1}
    assert len(list((tmp_path / "cache" / "trees").iterdir())) == 2


def test_a_dataset_name_or_version_that_would_leave_the_output_directory_is_refused() -> None:
    for spec in ("../x@1", "a/../b@1", "/abs@1", "x@../1", "x@1/2", ".hidden@1", "x@"):
        with pytest.raises(ConfigError, match=r"NAME@VERSION|the version must be"):
            parse_spec(spec)
    assert parse_spec("terminal-bench@2.0") == ("terminal-bench", "2.0")
    assert parse_spec("org/set@head") == ("org/set", "head")
    assert parse_spec("solo") == ("solo", None)


@pytest.mark.parametrize(
    ("url", "fetched"),
    [
        ("https://github.com/laude-institute/terminal-bench-2.git", True),
        ("http://127.0.0.1:8080/x.git", True),
        ("git://[::1]:9418/x", True),
        ("fd::17", False),
        ("ext::git-remote-https %S https://x", False),
        ("file:///etc", False),
        ("https://-oProxyCommand=touch/x.git", False),
        ("https://host/x.git?q=1", False),
        ("https://host/", False),
        ("https://host/x\x1b[2J.git", False),
        ("git@github.com:org/repo.git", False),
    ],
)
def test_only_plain_network_urls_are_fetched(url: str, fetched: bool) -> None:
    assert (check_url(url) is None) == fetched, check_url(url)


def test_a_dataset_is_found_by_name_and_version_or_the_error_names_what_there_is() -> None:
    datasets: list[object] = [
        {"name": "demo", "version": "1.0", "tasks": []},
        {"name": "demo", "version": "2", "tasks": []},
        {"name": "solo", "version": "0.1", "tasks": [], "metrics": [{"type": "mean"}]},
        {"name": "broken", "version": "1"},
        "not a dataset",
    ]
    assert find_dataset(datasets, "demo", "2", "r").spec == "demo@2"
    assert find_dataset(datasets, "solo", None, "r").spec == "solo@0.1"
    cases = [
        ("nope", "1", "no dataset 'nope' in the registry r; it has 3: broken, demo, solo"),
        ("demo", "9", "no version '9' of demo in r; it has 1.0, 2"),
        ("demo", None, "demo has 2 versions in r (1.0, 2); name one: demo@VERSION"),
        ("broken", "1", "broken@1 in the registry r has no list of tasks"),
    ]
    for name, version, message in cases:
        with pytest.raises(SandrlError) as caught:
            find_dataset(datasets, name, version, "r")
        assert str(caught.value) == message


def test_bad_input_on_the_command_line_is_one_line_naming_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    registry = tmp_path / "registry.json"
    registry.write_text(json.dumps([{"name": "demo", "version": "1.0", "tasks": []}]))
    (tmp_path / "config.toml").write_text('registry = "registry.json"\nmirror = 1\n')
    (tmp_path / "other" / ".sandrl").mkdir(parents=True)
    (tmp_path / "other" / ".sandrl" / "dataset.json").write_text('{"dataset": "x@1", "tasks": {}}')
    cases = [
        (["../demo@1.0"], "is not NAME@VERSION"),
        (["--registry", "http://127.0.0.1:9/registry.json", "demo@1.0"], "cannot fetch the registry"),
        (["demo@1.0"], "unknown key 'mirror'"),  # the registry the config file names
        ([str(registry), "demo@1.0", "--out", "other"], "holds x@1, not demo@1.0"),  # not mixed with another
    ]
    for args, message in cases:
        env = {"SANDRL_CACHE_DIR": str(tmp_path / "cache"), "SANDRL_DATASETS_CONFIG": str(tmp_path / "config.toml")}
        r = run_sandrl(
            ["tasks", "pull", *args], cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys, columns=200, env=env
        )
        assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_registry_that_is_not_one_is_refused(tmp_path: Path) -> None:
    for body, message in [
        (b"<html>", "is not JSON"),
        (b'{"name": "demo"}', "is not a list of datasets"),
        (b"\xff\xfe", "is not JSON"),
    ]:
        (tmp_path / "r.json").write_bytes(body)
        with pytest.raises(TaskError, match=message):
            read_registry(str(tmp_path / "r.json"), tmp_path)
    with pytest.raises(ConfigError, match="cannot read the registry"):
        read_registry(str(tmp_path / "missing.json"), tmp_path)
    (tmp_path / "r.json").write_text(json.dumps({"datasets": [{"name": "d", "version": "1", "tasks": []}]}))
    assert read_registry(str(tmp_path / "r.json"), tmp_path)[0][0]["name"] == "d"
