"""Copy a sandbox's writable directory into a layer tree on the host, owners shifted, without tar.

:mod:`.export` reads each overlay's upper directory through ``/proc/<helper pid>/root``, the
helper's mount namespace, where the upper directories sit on the sandbox's tmpfs. That tree is
the sandbox's to shape (it may hold symlinks, hard links, whiteouts, anything its root can
make), so it is walked with :func:`os.fwalk` without following symlinks: every directory is
opened relative to its parent's descriptor and checked to be the directory that was listed,
every file is opened relative to its directory with ``O_NOFOLLOW`` and checked to be the file
that was listed, so nothing a concurrent writer renames reaches outside the tree. File contents
move with ``sendfile`` (the kernel copies them), holes kept as holes, and every write is charged
to the layer's :class:`~.layer_budget.LayerBudget` first (``disk_mb`` as the store counts it, the
store's free space, entries, depth); owners, modes, times and the kept extended attributes are set
as :mod:`.layer_owners` says a layer holds them.

About ten times faster than a tar stream re-owned by :mod:`tarfile` in Python: a 10 MiB file
is one ``sendfile``, and no process is started.
"""

from __future__ import annotations

import functools
import os
import posixpath
import stat
from collections.abc import Callable

from sandrl.sandbox.bwrap.layer_budget import BLOCK, LayerBudget, copy_into_new
from sandrl.sandbox.bwrap.layer_owners import NOBODY, copy_xattrs, layer_mode, place_special, store_id
from sandrl.sandbox.bwrap.state import UID_RANGE

__all__ = ["copy_upper", "shift_owner"]

_OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


def shift_owner(value: int, base: int) -> int:
    """A host uid (or gid) of the upper dir -> its owner in the store's mapping.

    Host root owns what overlayfs made itself (whiteouts): sandbox root's in the layer.
    """
    if base <= value < base + UID_RANGE:
        return store_id(value - base)
    return store_id(0 if value == 0 else NOBODY)


def _copy_file(dir_fd: int, name: str, st: os.stat_result, dst: str, budget: LayerBudget, shown: str) -> bool:
    """Copy a regular file's bytes; False if it is not the file that was listed any more."""
    try:
        fin = os.open(name, _OPEN_FILE, dir_fd=dir_fd)
    except OSError:
        return False
    try:
        now = os.fstat(fin)
        if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            return False
        copy_into_new(fin, now, dst, budget, shown)
    finally:
        os.close(fin)
    return True


def _meta(dst: str, st: os.stat_result, base: int, dir_fd: int, name: str, budget: LayerBudget) -> None:
    """Owner, mode, kept xattrs and (for non-directories) times of ``dst``, from ``st``."""
    copy_xattrs(f"/proc/self/fd/{dir_fd}/{name}" if name else f"/proc/self/fd/{dir_fd}", dst, budget)
    os.chown(dst, shift_owner(st.st_uid, base), shift_owner(st.st_gid, base), follow_symlinks=False)
    if not stat.S_ISLNK(st.st_mode):
        os.chmod(dst, stat.S_IMODE(layer_mode(st.st_mode)))
    if not stat.S_ISDIR(st.st_mode):
        os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)


def copy_upper(
    source: str, dest: str, base: int, excluded: Callable[[str], bool], budget: LayerBudget, where: str = "/"
) -> int:
    """Copy the tree ``source`` into the directory ``dest`` (made if missing) as a layer tree; return
    how many entries it held, its root included. ``excluded(relative path)`` leaves an entry (and
    all under it) out; block and character devices other than whiteouts (0:0) and sockets are left
    out too, as layers are mounted ``nodev``. Every write is charged to ``budget`` first, which
    raises :class:`~sandrl.errors.LayerTooLargeError` when the layer is over a bound; ``where``
    (the tree's mount point in the sandbox) names its files in those errors."""
    os.makedirs(dest, mode=0o700, exist_ok=True)
    budget.charge(BLOCK, 1)
    top = os.open(source, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        _meta(dest, os.fstat(top), base, top, "", budget)
    finally:
        os.close(top)
    count = 1
    links: dict[tuple[int, int], str] = {}
    dirs: list[tuple[str, os.stat_result]] = [(dest, os.stat(source, follow_symlinks=False))]
    for dirpath, dirnames, filenames, dir_fd in os.fwalk(source, follow_symlinks=False):
        rel = os.path.relpath(dirpath, source)
        out_dir = dest if rel == "." else os.path.join(dest, rel)
        keep_dirs = []
        for name in [*dirnames, *filenames]:
            path = name if rel == "." else os.path.join(rel, name)
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if excluded(path):
                continue
            dst = os.path.join(out_dir, name)
            mode = st.st_mode
            if stat.S_ISDIR(mode):
                budget.directory(posixpath.join(where, path), name)  # and its depth: os.fwalk recurses
                os.mkdir(dst, 0o700)
                keep_dirs.append(name)
                dirs.append((dst, st))
            elif stat.S_ISREG(mode):
                budget.entry(name)
                key = (st.st_dev, st.st_ino)
                if st.st_nlink > 1 and key in links:
                    os.link(links[key], dst)
                    count += 1
                    continue
                if not _copy_file(dir_fd, name, st, dst, budget, posixpath.join(where, path)):
                    continue
                if st.st_nlink > 1:
                    links[key] = dst
            elif not place_special(st, name, dst, budget, functools.partial(os.readlink, name, dir_fd=dir_fd)):
                continue
            _meta(dst, st, base, dir_fd, name, budget)
            count += 1
        dirnames[:] = [d for d in dirnames if d in keep_dirs]
    for path, st in reversed(dirs):  # children first: adding entries moved each parent's times
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    return count
