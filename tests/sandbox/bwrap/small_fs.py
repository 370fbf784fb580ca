"""An image store on a small filesystem of its own: a test that goes wrong fills it, never the host's.

The tests of what a layer may write into the store (``test_layer_bounds``, the builder's
``test_build_bounds``) put the provider's state directory's ``images/`` on a filesystem of a few
hundred MiB made for the test: a tmpfs (files up to 8 EiB, so a huge sparse file fits as holes) or
an ext4 image on a loop device (files up to 16 TiB: a larger apparent size cannot be held at all).
Code that copied holes as zeros would fill that filesystem and fail, not the host's disk.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandrl.sandbox.bwrap import BwrapProvider

KINDS = ("tmpfs", "ext4")
SIZE_MB = 256


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


@contextlib.contextmanager
def small_filesystem(at: Path, kind: str, size_mb: int = SIZE_MB) -> Iterator[Path]:
    """A filesystem of ``size_mb`` mounted at ``at`` (made if missing); skips the test if this host cannot."""
    at.mkdir(parents=True, exist_ok=True)
    if kind == "tmpfs":
        made = _run("mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0700", "sandrl-test-store", str(at))
    else:
        if shutil.which("mkfs.ext4") is None:
            pytest.skip("mkfs.ext4 (e2fsprogs) is not installed")
        image = at.parent / f".{at.name}-{uuid.uuid4().hex[:8]}.ext4"
        with open(image, "wb") as f:
            f.truncate(size_mb << 20)
        formatted = _run("mkfs.ext4", "-q", "-F", "-m", "0", str(image))
        if formatted.returncode != 0:
            pytest.skip(f"mkfs.ext4 failed: {formatted.stderr.strip()}")
        made = _run("mount", "-o", "loop", str(image), str(at))
        image.unlink()  # the loop device holds it until the unmount
    if made.returncode != 0:
        pytest.skip(f"cannot mount a {kind} filesystem here: {made.stderr.strip()}")
    try:
        yield at
    finally:
        _run("umount", "-l", str(at))


@contextlib.contextmanager
def provider_on_small_store(parent: Path, kind: str, size_mb: int = SIZE_MB) -> Iterator[BwrapProvider]:
    """A provider whose image store is a small filesystem of its own (see the module)."""
    state = parent / f"state-{kind}"
    with small_filesystem(state / "images", kind, size_mb):
        provider = BwrapProvider(state)
        try:
            yield provider
        finally:
            provider._close_all_sync()


def holds_apparent_size(directory: Path, size: int) -> bool:
    """Whether the filesystem of ``directory`` can hold a (sparse) file of ``size`` bytes."""
    probe = directory / f".probe-{uuid.uuid4().hex}"
    try:
        with open(probe, "wb") as f:
            f.truncate(size)
        return True
    except OSError as exc:
        if exc.errno not in (errno.EFBIG, errno.EINVAL):
            raise
        return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(probe)


def allocated_bytes(root: Path) -> int:
    """The bytes the filesystem allocated for every entry under ``root`` (``st_blocks``), hard links once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            st = os.lstat(os.path.join(dirpath, name))
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def store_state(provider: BwrapProvider) -> tuple[set[str], set[str]]:
    """Everything in the store's layer directory (temporary entries included) and its image names:
    equal before and after a refused layer when nothing of it stayed."""
    return set(os.listdir(provider.images.root / "layers")), set(provider.images.names())
