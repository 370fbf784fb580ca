"""The host image shows only what the host's unprivileged users may read: hidden in every sandbox
made after a root-only entry appeared, unreadable in every sandbox already running when it appears.

Adversarial: the files are planted on the host *after* the provider has looked at the host,
as a secret installed while the server runs would be, and in a running sandbox that has already
read (and so cached) the files the host then closes.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandrl.sandbox.base import Sandbox, SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.sandbox.bwrap.images import ImageStore

from ...support import needs_sandbox

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


async def _seen_in(sandbox: Sandbox, paths: list[Path]) -> dict[Path, str]:
    """For each path, what ``sandbox``'s root sees: its content, 'DIR', or 'ABSENT' / 'UNREADABLE'."""
    script = []
    for p in paths:
        q = shlex.quote(str(p))
        script.append(
            f"if [ ! -e {q} ] && [ ! -L {q} ]; then echo ABSENT; elif [ -d {q} ]; then echo DIR; "
            f"else cat {q} 2>/dev/null || echo UNREADABLE; fi"
        )
    result = await sandbox.exec("\n".join(script))
    assert result.exit_code == 0, result
    return dict(zip(paths, result.stdout.splitlines(), strict=True))


async def _visible(provider: BwrapProvider, paths: list[Path]) -> dict[Path, str]:
    """For each path, what a new sandbox sees (as :func:`_seen_in` says it)."""
    async with await provider.create(SandboxSpec(ttl_s=60)) as sandbox:
        return await _seen_in(sandbox, paths)


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


async def test_a_running_sandbox_never_reads_what_becomes_root_only(
    provider: BwrapProvider, planted: list[Path]
) -> None:
    """Whatever the host makes root-only while a sandbox runs is unreadable to that sandbox's root
    from then on: new files and directories, and files and directories made root-only by a chmod
    after the sandbox had read them (their inodes are in its caches), in /etc and in /usr."""
    etc_file = _plant_file(planted, _unique("/etc", "file"), 0o644, "was public\n")
    usr_file = _plant_file(planted, _unique("/usr/local/share", "file"), 0o644, "was public\n")
    masked_dir, open_dir = _unique("/etc", "masked"), _unique("/etc", "dir")
    for d in (masked_dir, open_dir):
        planted.append(d)
        d.mkdir(mode=0o755)
        os.chmod(d, 0o755)
    _plant_file(planted, masked_dir / "hidden", 0o600)  # so that the mask layer holds the directory too
    masked_file = _plant_file(planted, masked_dir / "file", 0o644, "was public\n")
    dir_file = _plant_file(planted, open_dir / "file", 0o644, "was public\n")
    async with await provider.create(SandboxSpec(ttl_s=120)) as sandbox:
        before = await _seen_in(sandbox, [etc_file, usr_file, masked_file, dir_file, masked_dir / "hidden"])
        assert set(before.values()) == {"was public", "ABSENT"}, before

        # Now the host's root closes them and writes secrets into them, and adds root-only entries.
        for path in (etc_file, usr_file, masked_file):
            os.chmod(path, 0o600)
            path.write_text(SECRET)
        os.chmod(open_dir, 0o700)
        dir_file.write_text(SECRET)
        etc_secret = _plant_file(planted, _unique("/etc", "secret"), 0o600)
        usr_secret = _plant_file(planted, _unique("/usr/local", "secret"), 0o600)
        new_dir = _unique("/etc", "newdir")
        planted.append(new_dir)
        new_dir.mkdir(mode=0o700)
        os.chmod(new_dir, 0o700)
        new_dir_file = _plant_file(planted, new_dir / "file", 0o644)
        public = _plant_file(planted, _unique("/etc", "public"), 0o644, "public\n")

        closed = [etc_file, usr_file, masked_file, dir_file, etc_secret, usr_secret, new_dir_file]
        seen = await _seen_in(sandbox, [*closed, public])
        leaked = {path: seen[path] for path in closed if seen[path] not in ("ABSENT", "UNREADABLE")}
        assert leaked == {}
        assert seen[public] == "public"  # the host's directories are still live: only what is closed is gone
        # Nor any other way: a copy (a copy-up needs the content), a chmod, listings of the closed directories.
        again = await sandbox.exec(
            f"cp {etc_file} /tmp/x; chmod 644 {etc_file} {usr_file}; cat {etc_file} {usr_file} /tmp/x; "
            f"ls {open_dir} {new_dir}; cat {open_dir}/* {new_dir}/*; find {open_dir} {new_dir} -type f -exec cat {{}} +"
        )
        assert SECRET.strip() not in again.stdout, again
        # What is still world-readable stays the sandbox's to change, copy-on-write.
        changed = await sandbox.exec(f"echo mine >> {public} && cat {public} && stat -c %u {public}")
        assert changed.stdout == "public\nmine\n0\n", changed
    assert public.read_text() == "public\n"


def test_a_host_directory_on_an_overlay_is_shown_as_it_is_with_a_warning(tmp_path: Path) -> None:
    """The kernel stacks two overlays at most: a host directory already on overlayfs (sandrl in a
    container) cannot be seen through the view under a sandbox's own overlay, so it is mounted as
    before, and whoever runs sandrl is told what that leaves open."""
    parts = {name: tmp_path / name for name in ("lower", "upper", "work", "etc")}
    for part in parts.values():
        part.mkdir()
    (parts["lower"] / "hostname").write_text("a container\n")
    options = f"lowerdir={parts['lower']},upperdir={parts['upper']},workdir={parts['work']}"
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, str(parts["etc"])], check=True)
    try:
        store = ImageStore(tmp_path / "store", host_etc=parts["etc"])
        with pytest.warns(UserWarning, match=r"is on overlayfs.*readable in that sandbox until it ends"):
            plan = store.host_image().plan
        layers = {layer: i for i, layer in enumerate(plan.layers)}
        assert layers[parts["etc"]] not in plan.host_views
        usr_on_overlay = subprocess.run(["stat", "-f", "-c", "%T", "/usr"], capture_output=True, text=True).stdout
        assert (layers[Path("/usr")] in plan.host_views) == ("overlay" not in usr_on_overlay)
    finally:
        subprocess.run(["umount", str(parts["etc"])], check=True)
