"""What the host image shows of the host's own directories: only what the host's unprivileged users may read.

The ``host`` image mounts the live host directories (``/usr``, ``/etc``, and ``/bin``,
``/sbin``, ``/lib*`` where they are real directories) as lower layers, idmapped so that host
root's files are the sandbox root's (it can change them, copy-on-write, as root in any image).
Two things keep what the host keeps from its users (not world-readable; a directory not
world-readable and searchable) out of a sandbox:

- **Every read goes through an unprivileged view** (the helper's ``--host-layer``): each host
  directory is seen through a read-only overlay of its own whose mounter has no
  ``CAP_DAC_OVERRIDE`` and owns nothing in it, and overlayfs checks every lookup, open and exec
  against the host's inode as it is at that moment with its mounter's credentials. So a file the
  host makes 0600, a directory it makes 0700, a root-only file it adds, while a sandbox runs, are
  unreadable to that sandbox's root at once (through any name: a hard link elsewhere changes the
  same inode). The sandbox's own overlay cannot do it: it checks the caller against a copy of the
  mode taken when the inode was first looked up, and its mounter must write the sandbox's files.
  The kernel stacks at most two overlays, so a host directory that is itself on overlayfs (sandrl
  in a container) cannot be viewed so (:func:`viewable`): it is mounted as it is, with a warning,
  and there a sandbox sees what becomes root-only while it runs until it ends.
- **Root-only entries are hidden by name** when a sandbox is made: an overlayfs whiteout in a
  *mask* layer above its directory. The set of such entries is kept live for the whole process:
  one scan per directory, then inotify on every visible directory beneath it. The queued events
  are read *synchronously* when an image is asked for (:meth:`HostViews.hidden`), and fsnotify
  queues an event before the system call that made or chmod'ed the file returns, so a sandbox
  created after a root-only file appeared (created, chmod'ed, moved in) never has it unmasked. An
  event queue overflow means a rescan; a host without enough inotify watches gets a full scan per
  call (slow, still right).

What stays open: a file a sandbox opened while it was world-readable stays open (as for any
host user); the names, sizes and times of root-only entries that appear in a world-readable
directory while a sandbox runs show in it (as ``ls -l`` shows them to any host user). And a
directory of a mask layer (one that held a root-only entry when the sandbox was made) keeps the
mode it had then for the sandbox's own overlay, whose path walk checks it: if the host later
makes that directory unsearchable, the world-readable files in it that the sandbox had already
looked up (still in its dentry cache) stay readable to it; any other lookup in it goes through
the view and is refused.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import os
import shutil
import stat
import struct
import threading
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from sandrl.sandbox.bwrap.layer_owners import from_host, store_id

_IN_ATTRIB = 0x00000004
_IN_MOVED_FROM = 0x00000040
_IN_MOVED_TO = 0x00000080
_IN_CREATE = 0x00000100
_IN_DELETE = 0x00000200
_IN_DELETE_SELF = 0x00000400
_IN_MOVE_SELF = 0x00000800
_IN_Q_OVERFLOW = 0x00004000
_IN_IGNORED = 0x00008000
_IN_ONLYDIR = 0x01000000
_IN_DONT_FOLLOW = 0x02000000
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_WATCH_MASK = (
    _IN_CREATE
    | _IN_ATTRIB
    | _IN_MOVED_TO
    | _IN_MOVED_FROM
    | _IN_DELETE
    | _IN_DELETE_SELF
    | _IN_MOVE_SELF
    | _IN_ONLYDIR
    | _IN_DONT_FOLLOW
)
_EVENT = struct.Struct("iIII")
_LIBC = ctypes.CDLL(None, use_errno=True)
MASK_VERSION = "mask-2"
"""Part of every mask layer's key: bump it when a mask's content or ownership changes meaning."""


def root_only(st: os.stat_result) -> bool:
    """True for an entry the host's unprivileged users could not read (a symlink never is)."""
    if stat.S_ISLNK(st.st_mode):
        return False
    if stat.S_ISDIR(st.st_mode):
        return st.st_mode & 0o005 != 0o005
    return not st.st_mode & 0o004


@dataclass(eq=False)
class _Tree:
    root: str
    hidden: set[str] = field(default_factory=set)
    wds: dict[str, int] = field(default_factory=dict)
    """Watched directory (relative path, "" = the root) → watch descriptor."""
    inodes: dict[str, int] = field(default_factory=dict)
    subdirs: dict[str, set[str]] = field(default_factory=dict)
    """Watched directory → its watched subdirectories, to forget a moved or deleted tree fast."""
    generation: int = 0

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel) if rel else self.root


def _join(parent: str, name: str) -> str:
    return f"{parent}/{name}" if parent else name


class HostViews:
    """The root-only entries of host directories, kept live with inotify. Use :func:`host_views`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._trees: dict[str, _Tree] = {}
        self._by_wd: dict[int, list[tuple[_Tree, str]]] = {}
        self._fd = -1
        self._pid = -1
        self._degraded = False
        self._libc = _LIBC

    def hidden(self, root: Path) -> tuple[int, frozenset[str]]:
        """``root``'s root-only entries (paths relative to it; nothing below a hidden directory)
        as of now, with a number that changes whenever anything under ``root`` may have changed."""
        with self._lock:
            if self._pid != os.getpid():
                self._reset()  # a forked child must not read its parent's events
            tree = self._trees.get(str(root))
            if tree is None:
                tree = self._trees[str(root)] = _Tree(str(root))
                self._scan(tree, "")
            elif self._degraded:
                self._rescan(tree)
            else:
                self._drain()
            return tree.generation, frozenset(tree.hidden)

    # -- inotify

    def _reset(self) -> None:
        """A new inotify instance and a full scan: at first use, in a forked child, after an overflow."""
        if self._fd >= 0:
            os.close(self._fd)  # in a forked child, its own copy: the parent's stays open
        self._pid = os.getpid()
        self._by_wd.clear()
        self._degraded = False
        self._fd = self._libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if self._fd < 0:
            self._degrade(ctypes.get_errno())
        for tree in self._trees.values():
            # The old watch descriptors belong to the closed instance: drop them, never remove them.
            tree.wds.clear()
            tree.inodes.clear()
            tree.subdirs.clear()
            tree.hidden.clear()
            tree.generation += 1
            self._scan(tree, "")

    def _degrade(self, err: int) -> None:
        if not self._degraded:
            warnings.warn(
                f"sandrl cannot watch the host's directories ({os.strerror(err)}): every sandbox create "
                "rescans them; raise fs.inotify.max_user_watches / max_user_instances",
                stacklevel=4,
            )
        self._degraded = True

    def _rescan(self, tree: _Tree) -> None:
        self._forget(tree, "")
        tree.hidden.clear()
        tree.generation += 1
        self._scan(tree, "")

    def _watch(self, tree: _Tree, rel: str) -> bool:
        """Watch a directory (before listing it, so nothing made meanwhile is missed); False if gone."""
        if self._degraded:
            return True
        wd = self._libc.inotify_add_watch(self._fd, os.fsencode(tree.path(rel)), _WATCH_MASK)
        if wd < 0:
            err = ctypes.get_errno()
            if err in (errno.ENOENT, errno.ENOTDIR, errno.EACCES):
                return False
            self._degrade(err)
            return True
        tree.wds[rel] = wd
        users = self._by_wd.setdefault(wd, [])
        if (tree, rel) not in users:
            users.append((tree, rel))
        if rel:
            tree.subdirs.setdefault(os.path.dirname(rel), set()).add(rel)
        return True

    def _unwatch(self, tree: _Tree, rel: str) -> None:
        wd = tree.wds.pop(rel, None)
        tree.inodes.pop(rel, None)
        if rel:
            tree.subdirs.get(os.path.dirname(rel), set()).discard(rel)
        if wd is None:
            return
        users = [u for u in self._by_wd.get(wd, []) if u != (tree, rel)]
        if users:
            self._by_wd[wd] = users
        else:
            self._by_wd.pop(wd, None)
            if not self._degraded:
                self._libc.inotify_rm_watch(self._fd, wd)

    def _scan(self, tree: _Tree, rel: str) -> None:
        """Record the root-only entries under the visible directory ``rel``, watching the rest."""
        stack = [rel]
        while stack:
            d = stack.pop()
            if not self._watch(tree, d):
                continue
            try:
                tree.inodes[d] = os.lstat(tree.path(d)).st_ino
                entries = list(os.scandir(tree.path(d)))
            except OSError:
                continue
            for entry in entries:
                child = _join(d, entry.name)
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if root_only(st):
                    tree.hidden.add(child)
                elif stat.S_ISDIR(st.st_mode):
                    stack.append(child)

    def _forget(self, tree: _Tree, rel: str) -> None:
        """Drop what is known at and under ``rel`` (hidden entries, watches)."""
        prefix = rel + "/" if rel else ""
        tree.hidden = {h for h in tree.hidden if h != rel and not h.startswith(prefix)}
        stack = [rel]
        while stack:
            d = stack.pop()
            stack.extend(tree.subdirs.pop(d, ()))
            self._unwatch(tree, d)

    def _refresh(self, tree: _Tree, rel: str) -> None:
        """Bring what is known about ``rel`` (and under it) in line with the host now."""
        try:
            st: os.stat_result | None = os.lstat(tree.path(rel))
        except OSError:
            st = None
        if not rel:  # the root itself is shown whatever its mode: nothing above it could hide it
            if st is None or tree.inodes.get("") != st.st_ino or "" not in tree.wds:
                self._rescan(tree)
        elif st is None:
            self._forget(tree, rel)
        elif root_only(st):
            if rel not in tree.hidden:
                self._forget(tree, rel)
                tree.hidden.add(rel)
        elif stat.S_ISDIR(st.st_mode):
            if rel in tree.hidden or rel not in tree.wds or tree.inodes.get(rel) != st.st_ino:
                self._forget(tree, rel)
                self._scan(tree, rel)
        else:
            self._forget(tree, rel)

    def _drain(self) -> None:
        while True:
            try:
                data = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                return
            offset = 0
            while offset < len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
                name = data[offset + _EVENT.size : offset + _EVENT.size + length].rstrip(b"\0")
                offset += _EVENT.size + length
                if mask & _IN_Q_OVERFLOW:
                    self._reset()
                    return
                self._event(wd, mask, os.fsdecode(name))

    def _event(self, wd: int, mask: int, name: str) -> None:
        users = list(self._by_wd.get(wd, ()))
        if mask & _IN_IGNORED:
            for tree, rel in users:
                if tree.wds.get(rel) == wd:
                    tree.wds.pop(rel)
                    tree.inodes.pop(rel, None)
            self._by_wd.pop(wd, None)
            return
        for tree, rel in users:
            tree.generation += 1
            if name:
                self._refresh(tree, _join(rel, name))
            elif not rel and mask & (_IN_DELETE_SELF | _IN_MOVE_SELF | _IN_ATTRIB):
                self._refresh(tree, "")  # the root: its parent is not watched
            elif mask & _IN_ATTRIB:
                self._refresh(tree, rel)


_STACKING_FS = {0x794C7630: "overlayfs", 0xF15F: "ecryptfs"}
"""Filesystems stacked on others (``f_type`` from statfs): the kernel stacks at most two."""
_WARNED: set[str] = set()


def viewable(host_dir: Path) -> bool:
    """Whether ``host_dir`` can be seen through the unprivileged view (not on a stacking filesystem
    already: the view's overlay and the sandbox's own on it would be one too many); warns once if not."""
    buf = ctypes.create_string_buffer(256)  # struct statfs: f_type is its first field, a long
    if _LIBC.statfs(os.fsencode(host_dir), buf) != 0:
        return True  # gone or unreadable: the launch says so, as for any layer
    kind = _STACKING_FS.get(ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF)
    if kind is None:
        return True
    if str(host_dir) not in _WARNED:
        _WARNED.add(str(host_dir))
        warnings.warn(
            f"{host_dir} is on {kind}, on which the kernel cannot stack the host image's unprivileged view and "
            "a sandbox's overlay: it is shown as it is, so a file the host makes root-only there while a host-image "
            "sandbox runs is readable in that sandbox until it ends (sandboxes made afterwards hide it); run sandrl "
            "on a host whose system directories are not on an overlay, or use images from a registry",
            stacklevel=3,
        )
    return False


_VIEWS: HostViews | None = None
_VIEWS_LOCK = threading.Lock()


def host_views() -> HostViews:
    """The process's one watcher (every provider and store of the process shares it)."""
    global _VIEWS
    with _VIEWS_LOCK:
        if _VIEWS is None:
            _VIEWS = HostViews()
        return _VIEWS


def mask_layer(base: Path, label: str, host_dir: Path, hidden: frozenset[str]) -> Path | None:
    """A store layer of whiteouts over ``hidden`` (paths under ``host_dir``); None when none.

    Keyed by content, so a live sandbox keeps the mask it started with. Directories on the
    way to a hidden entry carry the host's own attributes (overlayfs takes a directory's from
    the topmost layer that has it), owned in the store's mapping like every store layer.
    """
    if not hidden:
        return None
    attrs: dict[str, tuple[int, int, int]] = {}
    kept: list[str] = []
    for h in sorted(hidden):
        parts = h.split("/")
        try:
            for i in range(len(parts)):
                rel = "/".join(parts[:i])
                if rel not in attrs:
                    st = os.lstat(host_dir / rel if rel else host_dir)
                    if not stat.S_ISDIR(st.st_mode):
                        raise NotADirectoryError(rel)
                    attrs[rel] = (stat.S_IMODE(st.st_mode), from_host(st.st_uid), from_host(st.st_gid))
        except OSError:
            continue  # gone since: nothing to hide
        kept.append(h)
    if not kept:
        return None
    spec = json.dumps([MASK_VERSION, kept, sorted(attrs.items())])
    target = base / f"{label}-mask-{hashlib.sha256(spec.encode()).hexdigest()[:16]}"
    if target.exists():
        return target
    tmp = base / f".{label}-mask-{uuid.uuid4().hex}"
    tmp.mkdir(mode=0o700)
    try:
        for rel, (mode, uid, gid) in sorted(attrs.items()):
            path = tmp / rel if rel else tmp
            path.mkdir(mode=0o700, exist_ok=True)
            os.chown(path, uid, gid)
            os.chmod(path, mode)
        root = store_id(0)
        for h in kept:
            os.mknod(tmp / h, stat.S_IFCHR | 0o000, os.makedev(0, 0))  # an overlayfs whiteout
            os.chown(tmp / h, root, root)
        os.rename(tmp, target)
    except OSError:
        if not target.exists():
            raise
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(tmp)
    return target
