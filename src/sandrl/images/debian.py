"""The Debian base image, made with debootstrap (``sandrl images build debian``): a minimal root
filesystem from a Debian mirror, for hosts whose own system is no base for task images.

debootstrap (``--variant=minbase``, ~40 MB of downloads) writes the root into a scratch directory
beside the store's layers, the apt caches it leaves are dropped, and the store takes the
directory as the image's one layer (moved, not copied). The store is any with
:meth:`~RootfsStore.add_rootfs`, the bubblewrap provider's :class:`~sandrl.sandbox.bwrap.images.ImageStore`
in practice (this package sits under the sandboxes and names no backend).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Protocol

from sandrl.errors import ImageBuildError

DEBIAN_IMAGE = "debian"
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBOOTSTRAP_TIMEOUT_S = 1800
_FAILURE_LINES = 15
"""How much of debootstrap's output a failure shows: its end, where it says why."""
_APT_SCRATCH = ("var/cache/apt/archives", "var/lib/apt/lists")
"""What debootstrap leaves that no image needs (the downloaded packages, the package lists)."""


class RootfsStore(Protocol):
    """An image store that takes a whole root filesystem directory as an image."""

    root: Path

    def exists(self, name: str) -> bool: ...

    def add_rootfs(self, name: str, source: Path, *, move: bool, env: dict[str, str], workdir: str) -> object: ...


def build_debian(
    store: RootfsStore, env: dict[str, str], *, suite: str = DEBIAN_SUITE, mirror: str = DEBIAN_MIRROR
) -> None:
    """Debian ``suite`` (minbase) from ``mirror`` into ``store`` as :data:`DEBIAN_IMAGE`, its
    processes started with ``env``; :class:`ImageBuildError` saying why when debootstrap is not
    installed or fails (the end of its output)."""
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None:
        raise ImageBuildError("debootstrap is not installed: apt-get install debootstrap, then run this again")
    work = store.root / "layers"
    work.mkdir(parents=True, exist_ok=True)
    target = Path(tempfile.mkdtemp(prefix=".debootstrap-", dir=work))
    try:
        proc = subprocess.run(
            [debootstrap, "--variant=minbase", suite, str(target), mirror],
            capture_output=True,
            text=True,
            timeout=DEBOOTSTRAP_TIMEOUT_S,
            check=False,
        )
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-_FAILURE_LINES:])
            raise ImageBuildError(
                f"debootstrap failed with exit code {proc.returncode} (is the mirror reachable?):\n{tail}"
            )
        os.chmod(target, 0o755)  # mkdtemp made it 0700: the image's / must be open to every user
        for scratch in _APT_SCRATCH:
            path = target / scratch
            if path.is_dir():
                for item in path.iterdir():
                    if item.is_file():
                        item.unlink()
        store.add_rootfs(DEBIAN_IMAGE, target, move=True, env=env, workdir="/")
    finally:
        shutil.rmtree(target, ignore_errors=True)
