"""A loopback git server for the dataset tests: ``git daemon`` on 127.0.0.1 over temporary
repositories, and the small Harbor task repositories it serves.

The daemon logs every request (``Request upload-pack for '/<repo>.git'``) to a file, so a test
counts how many times each repository was fetched from outside the code under test.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from sandrl.processes import stop_process

Tree = Mapping[str, "str | bytes | Link"]


class Link(str):
    """A symbolic link's target, in a :data:`Tree`."""


def _git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
        "GIT_CONFIG_GLOBAL": "/dev/null",
    }
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env=env, check=True)
    return done.stdout.strip()


def write_tree(root: Path, files: Tree) -> None:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Link):
            path.symlink_to(str(content))
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
            if name.endswith(".sh"):
                path.chmod(0o755)


def harbor_task(answer: str) -> dict[str, str | bytes | Link]:
    """A Harbor task the oracle solves: its solution writes ``answer``, its test checks it."""
    return {
        "task.toml": "[agent]\ntimeout_sec = 60.0\n\n[verifier]\ntimeout_sec = 60.0\n",
        "instruction.md": f"Write {answer} into /workspace/answer.txt.\n",
        "environment/Dockerfile": "FROM host\nWORKDIR /workspace\n",
        "solution/solve.sh": f"#!/bin/bash\necho {answer} > /workspace/answer.txt\n",
        "tests/test.sh": (
            "#!/bin/bash\nmkdir -p /logs/verifier\n"
            f"if grep -qx {answer} /workspace/answer.txt; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n"
        ),
    }


class GitServer:
    """``git daemon --export-all`` on a free loopback port over the bare repositories in ``base``."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.work = base.parent / "work"
        self.log = base.parent / "daemon.log"
        base.mkdir(parents=True)
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    def repository(
        self, name: str, commits: list[Tree], config: Mapping[str, str] = {}, submodules: tuple[str, ...] = ()
    ) -> list[str]:
        """A bare repository ``name.git`` with one commit per tree (each adding to the last; the
        last also holds a submodule entry at each of ``submodules``); the commit ids."""
        work = self.work / name
        work.mkdir(parents=True)
        _git(work, "init", "-q", "-b", "main")
        ids = []
        for i, files in enumerate(commits):
            write_tree(work, files)
            _git(work, "add", "-A")
            if i == len(commits) - 1:
                for path in submodules:
                    _git(work, "update-index", "--add", "--cacheinfo", f"160000,{'1' * 40},{path}")
            _git(work, "commit", "-q", "-m", f"commit {i}")
            ids.append(_git(work, "rev-parse", "HEAD"))
        bare = self.base / f"{name}.git"
        subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True, capture_output=True)
        _git(work, "remote", "add", "origin", str(bare))
        for key, value in config.items():
            _git(bare, "config", key, value)
        return ids

    def commit(self, name: str, files: Tree) -> str:
        """One more commit on ``main`` of repository ``name``, as a push brings it; its id."""
        work = self.work / name
        write_tree(work, files)
        _git(work, "add", "-A")
        _git(work, "commit", "-q", "-m", "one more")
        _git(work, "push", "-q", "origin", "main")
        return _git(work, "rev-parse", "HEAD")

    def url(self, name: str) -> str:
        return f"git://127.0.0.1:{self.port}/{name}.git"

    def start(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        log = self.log.open("ab")
        self.process = subprocess.Popen(
            [
                "git", "daemon", "--reuseaddr", "--export-all", "--verbose", "--log-destination=stderr",
                f"--base-path={self.base}", "--listen=127.0.0.1", f"--port={self.port}", str(self.base),
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )  # fmt: skip
        log.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        raise RuntimeError("git daemon did not start")

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process, grace_s=5)
            self.process = None

    def fetches(self) -> dict[str, int]:
        """How many times each repository was fetched (``upload-pack`` requests), by its name."""
        counts: dict[str, int] = {}
        for line in self.log.read_text(errors="replace").splitlines():
            if "Request upload-pack for '/" in line:
                name = line.split("'/")[1].split("'")[0].removesuffix(".git")
                counts[name] = counts.get(name, 0) + 1
        return counts
