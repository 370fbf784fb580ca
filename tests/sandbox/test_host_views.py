"""The host image hides what only host root may read, in every sandbox made after it appeared.

Adversarial: the files are planted on the host *after* the provider has looked at the host,
as a secret installed while the server runs would be.
"""

from __future__ import annotations

import os
import shlex
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider

from ..support import needs_sandbox

pytestmark = needs_sandbox


@pytest.fixture(scope="module")
def provider(either_launch: BwrapProvider) -> BwrapProvider:
    """Each test on a sandbox that bubblewrap set up and on one that the helper did (a fork's child)."""
    return either_launch


SECRET = "sandrl-test-secret-content\n"


@pytest.fixture
def planted() -> Iterator[list[Path]]:
    """Paths a test plants on the host; removed whatever happens."""
    paths: list[Path] = []
    try:
        yield paths
    finally:
        for p in reversed(paths):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


def _plant_file(paths: list[Path], path: Path, mode: int, text: str = SECRET) -> Path:
    paths.append(path)
    path.write_text(text)
    os.chmod(path, mode)
    return path


def _unique(parent: str, what: str) -> Path:
    return Path(parent) / f"sandrl-test-{uuid.uuid4().hex[:12]}-{what}"


async def _visible(provider: BwrapProvider, paths: list[Path]) -> dict[Path, str]:
    """For each path, what a new sandbox sees: its content, 'DIR', or 'ABSENT' / 'UNREADABLE'."""
    script = []
    for p in paths:
        q = shlex.quote(str(p))
        script.append(
            f"if [ ! -e {q} ] && [ ! -L {q} ]; then echo ABSENT; elif [ -d {q} ]; then echo DIR; "
            f"else cat {q} 2>/dev/null || echo UNREADABLE; fi"
        )
    async with await provider.create(SandboxSpec(ttl_s=60)) as sandbox:
        result = await sandbox.exec("\n".join(script))
    assert result.exit_code == 0, result
    return dict(zip(paths, result.stdout.splitlines(), strict=True))


async def test_root_only_entries_planted_after_the_provider_are_hidden(
    provider: BwrapProvider, planted: list[Path]
) -> None:
    provider.images.get("host")  # the provider has seen the host before anything is planted
    usr_secret = _plant_file(planted, _unique("/usr/local", "secret"), 0o600)
    usr_dir = _unique("/usr/local", "dir")
    planted.append(usr_dir)
    usr_dir.mkdir(mode=0o700)
    os.chmod(usr_dir, 0o700)
    inner = usr_dir / "inner"
    inner.write_text(SECRET)
    os.chmod(inner, 0o644)
    etc_secret = _plant_file(planted, _unique("/etc", "secret"), 0o600)
    public = _plant_file(planted, _unique("/usr/local", "public"), 0o644, "public\n")
    seen = await _visible(provider, [usr_secret, usr_dir, inner, etc_secret, public])
    assert seen == {usr_secret: "ABSENT", usr_dir: "ABSENT", inner: "ABSENT", etc_secret: "ABSENT", public: "public"}


async def test_entries_chmod_and_moved_later_follow_the_host(provider: BwrapProvider, planted: list[Path]) -> None:
    provider.images.get("host")
    file = _plant_file(planted, _unique("/usr/local/share", "file"), 0o644, "open\n")
    directory = _unique("/usr/local/share", "dir")
    planted.append(directory)
    directory.mkdir(mode=0o755)
    os.chmod(directory, 0o755)
    _plant_file(planted, directory / "inner", 0o644, "inner\n")
    assert await _visible(provider, [file, directory / "inner"]) == {file: "open", directory / "inner": "inner"}

    os.chmod(file, 0o640)
    os.chmod(directory, 0o750)
    # Made root-only elsewhere, then moved in: the move is an event of its own.
    moved_src = _plant_file(planted, _unique("/usr/local", "staged"), 0o600)
    moved = Path("/etc") / moved_src.name
    planted.append(moved)
    os.rename(moved_src, moved)
    seen = await _visible(provider, [file, directory / "inner", moved])
    assert seen == {file: "ABSENT", directory / "inner": "ABSENT", moved: "ABSENT"}

    os.chmod(file, 0o644)
    os.chmod(directory, 0o755)
    assert await _visible(provider, [file, directory / "inner"]) == {file: "open", directory / "inner": "inner"}
