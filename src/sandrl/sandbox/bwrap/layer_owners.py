"""Owners and modes of the files in image layers: the store's own uid mapping, never host root.

Every file of a store layer is owned on disk by ``STORE_UID_BASE + n`` for sandbox uid ``n``
(0..65535); sandboxes mount store layers idmapped so that ``STORE_UID_BASE + n`` appears as
``n`` (the helper's ``--store-layer``). So a file that is root's inside a sandbox is an
unprivileged, unused uid on the host, and whatever a build leaves in a layer gives no host
user anything, even if the store's directories were reachable.

Setuid and setgid bits are stripped from every non-directory: sandboxes run with
``NO_NEW_PRIVS``, so those bits were never honoured inside one anyway, and on the host they
are the way from a hostile build to host root. Only the extended attributes a layer needs
(``KEPT_XATTRS``) are kept: ``security.capability`` would be file capabilities (honoured
outside, ignored inside under ``NO_NEW_PRIVS`` too) and POSIX ACLs name host uids unshifted.

Sandbox slots use uids from ``0x70000000`` up (:mod:`sandrl.sandbox.bwrap.state`), so the store's
range ``[STORE_UID_BASE, STORE_UID_BASE + 65536)`` never meets a sandbox's.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import os
import stat
from collections.abc import Callable
from pathlib import Path

from sandrl.sandbox.bwrap.layer_budget import BLOCK, LayerBudget, copy_into_new
from sandrl.sandbox.bwrap.state import STORE_UID_BASE, UID_RANGE

__all__ = [
    "KEPT_XATTRS",
    "STORE_UID_BASE",
    "copy_shifted",
    "copy_xattrs",
    "from_host",
    "layer_mode",
    "shift_in_place",
    "store_id",
]
NOBODY = 65534
KEPT_XATTRS = ("trusted.overlay.opaque", "user.*")
"""Extended attributes a layer keeps; every other one is dropped on the way into the store."""
_SETID = stat.S_ISUID | stat.S_ISGID


def store_id(sandbox_id: int) -> int:
    """The on-disk owner in a store layer of the sandbox's uid (or gid) ``sandbox_id``."""
    return STORE_UID_BASE + (sandbox_id if 0 <= sandbox_id < UID_RANGE else NOBODY)


def from_host(host_id: int) -> int:
    """The store owner for a file owned by ``host_id`` in a tree brought into the store.

    A tree made for a sandbox (a rootfs, an old layer) uses the sandbox's own ids, as the
    host's mapping of its layers showed them (host ``n`` = sandbox ``n``); ids already in the
    store's range stay, so shifting twice changes nothing.
    """
    if STORE_UID_BASE <= host_id < STORE_UID_BASE + UID_RANGE:
        return host_id
    return store_id(host_id)


def layer_mode(mode: int) -> int:
    """``mode`` (an ``st_mode``) as a layer may hold it: no setuid/setgid on anything but a directory."""
    return mode if stat.S_ISDIR(mode) else mode & ~_SETID


def kept_xattr(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in KEPT_XATTRS)


def _drop_xattrs(path: str) -> None:
    with contextlib.suppress(OSError):
        for name in os.listxattr(path, follow_symlinks=False):
            if not kept_xattr(name):
                os.removexattr(path, name, follow_symlinks=False)


def copy_xattrs(src: str, dst: str, budget: LayerBudget) -> None:
    """Copy the kept extended attributes of ``src`` to ``dst`` (no symlink followed), charged to ``budget``."""
    try:
        names = [name for name in os.listxattr(src, follow_symlinks=False) if kept_xattr(name)]
    except OSError:
        return
    kept: list[tuple[str, bytes]] = []
    for name in names:
        with contextlib.suppress(OSError):
            kept.append((name, os.getxattr(src, name, follow_symlinks=False)))
    if not kept:
        return
    budget.xattrs(sum(len(name) + len(value) for name, value in kept))
    for name, value in kept:
        with contextlib.suppress(OSError):
            os.setxattr(dst, name, value, follow_symlinks=False)


def _fix(path: str, st: os.stat_result) -> None:
    if stat.S_ISBLK(st.st_mode) or (stat.S_ISCHR(st.st_mode) and st.st_rdev != 0):
        os.unlink(path)  # as copy_shifted leaves them out: a real device in a layer is of no use
        return
    _drop_xattrs(path)
    if not stat.S_ISLNK(st.st_mode):
        # The mode first: a root-owned setuid file must not be handed to another owner as is.
        os.chmod(path, stat.S_IMODE(layer_mode(st.st_mode)))
    os.chown(path, from_host(st.st_uid), from_host(st.st_gid), follow_symlinks=False)


def shift_in_place(root: Path) -> None:
    """Make a tree already inside the store's private directories a store layer (see the module)."""
    top = str(root)
    _fix(top, os.lstat(top))
    for dirpath, dirnames, filenames in os.walk(top):  # never follows symlinks
        for name in [*dirnames, *filenames]:
            path = os.path.join(dirpath, name)
            with contextlib.suppress(FileNotFoundError):
                _fix(path, os.lstat(path))


def copy_shifted(source: Path, target: Path, budget: LayerBudget) -> None:
    """Copy the tree ``source`` to the new directory ``target`` as a store layer (see the module).

    Each file is created private (0600) and root's, then gets its store owner and stripped mode
    (:func:`_place_meta`), so no moment leaves a setuid file of host root in ``target``.
    Hard links stay links, holes stay holes, and every write is charged to ``budget``
    (:mod:`.layer_budget`); device nodes other than overlayfs whiteouts and sockets are left out
    (layers are mounted ``nodev``; they would do nothing).
    """
    links: dict[tuple[int, int], str] = {}
    dirs: list[tuple[str, os.stat_result]] = []
    src_top, dst_top = str(source), str(target)
    budget.charge(BLOCK, 1)
    os.mkdir(dst_top, 0o700)
    _place_meta(src_top, dst_top, os.lstat(src_top), dirs, budget)
    for dirpath, dirnames, filenames in os.walk(src_top):
        rel = os.path.relpath(dirpath, src_top)
        dst_dir = dst_top if rel == "." else os.path.join(dst_top, rel)
        for name in [*dirnames, *filenames]:
            src, dst = os.path.join(dirpath, name), os.path.join(dst_dir, name)
            st = os.lstat(src)
            if _place(src, dst, st, links, budget, os.path.join(rel, name)):
                _place_meta(src, dst, st, dirs, budget)
    for path, st in reversed(dirs):  # children first: adding entries moved each parent's times
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _place(
    src: str, dst: str, st: os.stat_result, links: dict[tuple[int, int], str], budget: LayerBudget, rel: str
) -> bool:
    """Create ``dst`` like ``src`` (content, not metadata); False when it is left out or a hard link."""
    mode, name = st.st_mode, os.path.basename(dst)
    if stat.S_ISDIR(mode):
        budget.directory(rel, name)
        os.mkdir(dst, 0o700)
    elif stat.S_ISREG(mode):
        budget.entry(name)
        key = (st.st_dev, st.st_ino)
        if key in links:
            os.link(links[key], dst)
            return False
        if st.st_nlink > 1:
            links[key] = dst
        fin = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            copy_into_new(fin, os.fstat(fin), dst, budget, rel)
        finally:
            os.close(fin)
    else:
        return place_special(st, name, dst, budget, functools.partial(os.readlink, src))
    return True


def place_special(st: os.stat_result, name: str, dst: str, budget: LayerBudget, readlink: Callable[[], str]) -> bool:
    """Create ``dst`` as the symlink (to ``readlink()``), overlayfs whiteout or FIFO that ``st`` is, its
    entry counted in ``budget``; False for any other kind of file."""
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        target = readlink()
        budget.symlink(name, target)
        os.symlink(target, dst)
    elif stat.S_ISCHR(mode) and st.st_rdev == 0:
        budget.entry(name)
        os.mknod(dst, stat.S_IFCHR | 0o000, 0)  # an overlayfs whiteout
    elif stat.S_ISFIFO(mode):
        budget.entry(name)
        os.mkfifo(dst, 0o600)
    else:
        return False
    return True


def _place_meta(
    src: str, dst: str, st: os.stat_result, dirs: list[tuple[str, os.stat_result]], budget: LayerBudget
) -> None:
    copy_xattrs(src, dst, budget)
    os.chown(dst, from_host(st.st_uid), from_host(st.st_gid), follow_symlinks=False)
    if not stat.S_ISLNK(st.st_mode):
        os.chmod(dst, stat.S_IMODE(layer_mode(st.st_mode)))
    if stat.S_ISDIR(st.st_mode):
        dirs.append((dst, st))
    else:
        os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
