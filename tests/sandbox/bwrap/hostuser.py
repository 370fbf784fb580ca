"""What an unprivileged local user of the host can do: the view the store must keep closed."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

NOBODY = 65534


def as_nobody(*argv: str) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` as host uid/gid 65534 with no supplementary groups.

    A shell that is already nobody's does the exec: setpriv's own exec of ``argv[0]`` reaches
    paths that uid 65534 cannot (seen with util-linux 2.38), which would prove nothing.
    """
    drop = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]
    return subprocess.run(
        [*drop, "/bin/sh", "-c", 'exec "$@"', "sh", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )


def world_traversable_dir(parent: Path, name: str) -> Path:
    """A directory any host user can walk into, as /var/lib is: the store below must close itself."""
    path = parent / name
    path.mkdir(mode=0o755)
    os.chmod(path, 0o755)
    for p in [path, *path.parents]:
        st = p.stat()
        assert st.st_mode & 0o001, f"{p} is not world-traversable: the test would prove nothing"
    return path


def layer_entries(store_root: Path) -> list[Path]:
    """Every entry inside the store's layers (its own record files and top directories aside)."""
    found: list[Path] = []
    for top in ("layers", "host"):
        base = store_root / top
        if base.is_dir():
            for layer in base.iterdir():
                found.append(layer)
                if layer.is_dir() and not layer.is_symlink():
                    found += list(layer.rglob("*"))
    return found


def outside_range(paths: list[Path], base: int, size: int = 65536) -> list[str]:
    bad = []
    for p in paths:
        st = p.lstat()
        if not (base <= st.st_uid < base + size and base <= st.st_gid < base + size):
            bad.append(f"{p} {st.st_uid}:{st.st_gid}")
    return bad


def setid_files(paths: list[Path]) -> list[str]:
    bad = []
    for p in paths:
        st = p.lstat()
        if not stat.S_ISDIR(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
            bad.append(f"{p} {stat.S_IMODE(st.st_mode):o}")
    return bad
