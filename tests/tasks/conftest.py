"""A small real sandbox for the task tests: bubblewrap over a temporary directory.

The real backend (sandrl.sandbox.bwrap) is written in parallel; until it lands, the verifier is
tested against this stand-in that implements the Sandbox protocol for real: commands run in
their own mount namespace with the host's system directories read-only, and the absolute paths
a task uses (/tests, /logs, /workspace, /testbed, /app, /solution, /tmp) bound to directories
under one temporary root. Only the edges are fake; verify() and the loaders run as they will.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import pytest

from sandrl.errors import SandboxFileError
from sandrl.sandbox.base import MAX_READ_BYTES, ExecResult, file_too_large
from sandrl.sandbox.command import Command, check_command, describe

# The fixtures are task directories whose tests run inside sandboxes, not here.
collect_ignore_glob = ["fixtures/*"]

BWRAP = shutil.which("bwrap")
WRITABLE = ("/tests", "/logs", "/workspace", "/testbed", "/app", "/solution", "/tmp")
OUTPUT_CAP = 1 << 20


def _python_dirs() -> list[str]:
    """The directories the test interpreter (with pytest) lives in, so the sandbox can run it."""
    dirs = {os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)}
    return sorted(d for d in dirs if not d.startswith("/usr"))


class BwrapSandbox:
    """Implements sandrl.sandbox.base.Sandbox with one bwrap process per exec."""

    def __init__(self, root: Path, *, workdir: str = "/workspace", env: Mapping[str, str] | None = None) -> None:
        self.id = f"fake-{root.name}"
        self.root = root
        self.workdir = workdir
        self.env = dict(env or {})
        self.closed = False
        self.commands: list[str] = []
        for mount in WRITABLE:
            (root / mount.lstrip("/")).mkdir(parents=True, exist_ok=True)
        self.host_path(workdir).mkdir(parents=True, exist_ok=True)

    def host_path(self, path: str) -> Path:
        if not path.startswith("/") or ".." in path.split("/"):
            raise SandboxFileError(f"{path}: not an absolute normalised path")
        top = "/" + path.split("/")[1]
        if top not in WRITABLE:
            raise SandboxFileError(f"{path}: outside the sandbox's writable directories")
        return self.root / path.lstrip("/")

    def _argv(self, command: Command, cwd: str) -> list[str]:
        assert BWRAP is not None
        argv = [BWRAP, "--die-with-parent", "--unshare-pid", "--unshare-ipc"]
        argv += ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
        for link in ("bin", "lib", "lib64", "sbin"):
            if os.path.islink(f"/{link}"):
                argv += ["--symlink", os.readlink(f"/{link}"), f"/{link}"]
        for directory in _python_dirs():
            argv += ["--ro-bind", directory, directory]
        argv += ["--proc", "/proc", "--dev", "/dev"]
        for mount in WRITABLE:
            argv += ["--bind", str(self.root / mount.lstrip("/")), mount]
        # An argv runs as given, with no shell (bwrap looks the program up in PATH), as a sandbox runs one.
        argv += ["--chdir", cwd, "--", *(["/bin/bash", "-c", command] if isinstance(command, str) else command)]
        return argv

    async def exec(
        self,
        command: Command,
        *,
        timeout_s: float = 60,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        if self.closed:
            raise RuntimeError("sandbox closed")
        command = check_command(command)
        self.commands.append(describe(command))
        cwd = cwd or self.workdir
        bin_dirs = [os.path.join(os.path.realpath(sys.prefix), "bin"), "/usr/local/bin", "/usr/bin", "/bin"]
        full_env = {"PATH": ":".join(bin_dirs), "HOME": "/tmp", "LANG": "C.UTF-8", **self.env, **(env or {})}
        start = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            *self._argv(command, cwd),
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=full_env,
            start_new_session=True,
        )
        timed_out = False
        try:
            out, err = await asyncio.wait_for(proc.communicate(stdin), timeout_s)
        except TimeoutError:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = await proc.communicate()
        code = 124 if timed_out else (proc.returncode if proc.returncode is not None else -1)
        truncated = len(out) > OUTPUT_CAP or len(err) > OUTPUT_CAP
        return ExecResult(
            exit_code=code,
            stdout=out[:OUTPUT_CAP].decode(errors="replace"),
            stderr=err[:OUTPUT_CAP].decode(errors="replace"),
            duration_s=time.monotonic() - start,
            timed_out=timed_out,
            truncated=truncated,
        )

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        target = self.host_path(path)
        if not target.parent.is_dir():
            raise SandboxFileError(f"{path}: parent directory does not exist")
        target.write_bytes(data)
        target.chmod(mode)

    async def read_file(self, path: str, *, max_bytes: int = MAX_READ_BYTES) -> bytes:
        target = self.host_path(path)
        if not target.exists():
            raise SandboxFileError(f"{path}: no such file", errno=errno.ENOENT)
        if not target.is_file():
            raise SandboxFileError(f"{path}: not a regular file", errno=errno.EINVAL)
        with target.open("rb") as f:
            data = f.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise file_too_large(path, "fake", max_bytes)
        return data

    async def close(self) -> None:
        self.closed = True

    async def __aenter__(self) -> BwrapSandbox:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


class SandboxFactory:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.count = 0

    def __call__(self, *, workdir: str = "/workspace", env: Mapping[str, str] | None = None) -> BwrapSandbox:
        self.count += 1
        root = self.base / f"sandbox{self.count}"
        root.mkdir(parents=True)
        return BwrapSandbox(root, workdir=workdir, env=env)


@pytest.fixture
async def make_sandbox(tmp_path: Path) -> AsyncIterator[SandboxFactory]:
    if BWRAP is None:
        pytest.skip("bubblewrap (bwrap) is not installed")
    yield SandboxFactory(tmp_path / "sandboxes")


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Repository snapshots go to the test's own directory, not ~/.cache."""
    monkeypatch.setenv("SANDRL_CACHE_DIR", str(tmp_path / "cache"))


# --- a small SWE-bench instance, built from a git repository the tests create ------------------

FIXTURES = Path(__file__).parent / "fixtures"

CALC_BASE = """\
def add(a, b):
    return a - b


def mul(a, b):
    return a * b
"""
CALC_FIXED = CALC_BASE.replace("return a - b", "return a + b")
TESTS_BASE = """\
from calc import add, mul


def test_mul():
    assert mul(3, 4) == 12


def test_add_zero():
    assert add(5, 0) == 5
"""
TESTS_ADDED = (
    TESTS_BASE
    + """

def test_add():
    assert add(2, 3) == 5
"""
)
TEST_MORE = """\
import pytest

from calc import add


@pytest.mark.parametrize("a,b,c", [(1, 2, 3), (2, 2, 4)])
def test_add_many(a, b, c):
    assert add(a, b) == c


class TestAdd:
    def test_commutes(self):
        assert add(2, 7) == add(7, 2)
"""
FAIL_TO_PASS = [
    "test_calc.py::test_add",
    "test_more.py::test_add_many[1-2-3]",
    "test_more.py::test_add_many[2-2-4]",
    "test_more.py::TestAdd::test_commutes",
]
PASS_TO_PASS = ["test_calc.py::test_mul", "test_calc.py::test_add_zero"]


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_DATE": "2024-01-01T00:00:00", "GIT_COMMITTER_DATE": "2024-01-01T00:00:00"}
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return done.stdout


@dataclass
class CalcRepo:
    """acme/calc: ``add`` subtracts; the fix and the tests for it are later commits of the clone."""

    mirror: Path
    source: Path
    base: str
    fix: str
    patch: str
    test_patch: str

    def record(self, **overrides: object) -> dict[str, object]:
        record: dict[str, object] = {
            "repo": "acme/calc",
            "instance_id": "acme__calc-1",
            "base_commit": self.base,
            "patch": self.patch,
            "test_patch": self.test_patch,
            "problem_statement": "add() subtracts instead of adding.\n",
            "hints_text": "",
            "created_at": "2024-01-01T00:00:00Z",
            "version": "1.0",
            # Both spellings occur: the published dataset JSON-encodes the lists.
            "FAIL_TO_PASS": json.dumps(FAIL_TO_PASS),
            "PASS_TO_PASS": PASS_TO_PASS,
            "environment_setup_commit": self.base,
        }
        record.update(overrides)
        return record

    def write(self, path: Path, *records: dict[str, object]) -> Path:
        if path.suffix == ".jsonl":
            path.write_text("".join(json.dumps(r) + "\n" for r in records))
        else:
            path.write_text(json.dumps(list(records), indent=1))
        return path


def make_calc_repo(root: Path) -> CalcRepo:
    mirror = root / "repos"
    source = mirror / "acme__calc"
    source.mkdir(parents=True)
    git(source, "init", "-q", "-b", "main")
    (source / "calc.py").write_text(CALC_BASE)
    (source / "test_calc.py").write_text(TESTS_BASE)
    (source / "README.md").write_text("calc\n")
    git(source, "add", "-A")
    git(source, "commit", "-q", "-m", "base")
    base = git(source, "rev-parse", "HEAD").strip()
    (source / "calc.py").write_text(CALC_FIXED)
    git(source, "commit", "-q", "-am", "fix add")
    fix = git(source, "rev-parse", "HEAD").strip()
    patch = git(source, "diff", base, fix)
    (source / "test_calc.py").write_text(TESTS_ADDED)
    (source / "test_more.py").write_text(TEST_MORE)
    git(source, "add", "-A")
    git(source, "commit", "-q", "-m", "tests for add")
    test_patch = git(source, "diff", fix, "HEAD")
    return CalcRepo(mirror=mirror, source=source, base=base, fix=fix, patch=patch, test_patch=test_patch)


@pytest.fixture
def calc_repo(tmp_path: Path) -> CalcRepo:
    return make_calc_repo(tmp_path / "data")
