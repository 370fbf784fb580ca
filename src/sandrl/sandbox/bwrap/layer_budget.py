"""What a new layer may write into the image store, and the copy into it that keeps holes as holes.

What a sandbox wrote becomes a layer of the store when it is snapshotted, forked or built. Its
writable layer was a tmpfs of ``disk_mb``, but that bound does not carry over by itself:

- a sparse file (``truncate -s 100T``) costs a tmpfs nothing; copied as bytes it is 100 TiB of
  zeros on the host's disk. :func:`copy_into_new` copies the data only (``SEEK_DATA`` /
  ``SEEK_HOLE``) and keeps the file's apparent size: holes stay holes. A file whose apparent size
  the store's filesystem cannot hold (ext4: 16 TiB) is refused, never made dense;
- a directory, a set of extended attributes or a long symlink costs a tmpfs no block and the
  store's filesystem one each; a tmpfs has as many inodes as memory allows, the store's
  filesystem a fixed number for the whole host;
- a tree nested thousands deep is a tmpfs's to hold, and beyond what walks, removals and paths on
  the host handle.

So every write into a new layer is charged to a :class:`LayerBudget` before it is made: data by
the blocks it allocates, every entry by its directory entry, a directory, a large set of extended
attributes and a long symlink by a block. A layer stays within the sandbox's ``disk_mb`` as the
store counts it, at most :func:`max_entries` entries, :data:`MAX_DEPTH` levels and
:data:`MAX_PATH` bytes of path, and it never takes the store's filesystem below its
:class:`StoreReserve` (free space and inodes, looked at before the copy and every
:data:`CHECK_EVERY_BYTES` during it, as other copies run at the same time). Over any of these the
copy stops with a :class:`~sandrl.errors.LayerTooLargeError` that says which bound and what to do;
its caller removes what was written. Hard links stay links (:mod:`.upper_copy`), symlinks are
never followed, so neither multiplies what is written.

A file that is not sparse (``st_blocks`` covers its size: nearly every file) is one ``sendfile``
as before, and the charge is arithmetic: the bounds cost a snapshot nothing measurable.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path

from sandrl.errors import ConfigError, LayerTooLargeError, SandboxError

__all__ = [
    "BLOCK",
    "MAX_DEPTH",
    "MAX_PATH",
    "MIN_FREE_ENV",
    "LayerBudget",
    "StoreReserve",
    "copy_into_new",
    "max_entries",
]

BLOCK = 4096
"""What the store's filesystem allocates at least for a block of data, a directory, an xattr block."""
MAX_DEPTH = 256
"""Directories a layer nests at most (a Debian system nests ~15; walks and removals recurse)."""
MAX_PATH = 3072
"""Bytes of a directory's path inside a layer at most: with the store's own prefix and a name of
255 bytes, every path stays under the kernel's 4096."""
MIN_FREE_ENV = "SANDRL_STORE_MIN_FREE_MB"
"""MiB the image store's filesystem keeps free whatever layers come (default: 5% of it)."""
DEFAULT_FREE_FRACTION = 0.05
CHECK_EVERY_BYTES = 64 << 20
"""How often (bytes charged) a copy looks at the store's free space again."""
CHECK_EVERY_ENTRIES = 4096
_INODE_XATTR_ROOM = 64
"""Extended attributes up to this (name and value bytes: an overlayfs opaque marker) fit in an inode."""
_FAST_SYMLINK = 60
"""Symlink targets shorter than this are kept in the inode; longer ones take a block."""
_OVERLAY_INODES = 64
"""Inodes of a sandbox's writable tmpfs that are its overlays' (upper and work directories), not its files."""
_MIB = 1 << 20


def max_entries(disk_mb: int) -> int:
    """Entries (files, directories, links...) a layer of a sandbox of ``disk_mb`` may hold: one per
    4 KiB of its disk, and never fewer than 65536 (a large ``pip install`` makes ~20,000)."""
    return max(65536, disk_mb * 256)


def _blocks(nbytes: int) -> int:
    return -(-nbytes // BLOCK) * BLOCK


def _human(nbytes: int) -> str:
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            value = nbytes / (1 << shift)
            return f"{value:.0f} {unit}" if value == int(value) or value >= 100 else f"{value:.1f} {unit}"
    return f"{nbytes} bytes"


@dataclass(frozen=True)
class StoreReserve:
    """What the image store's filesystem keeps free whatever layers come: new layers stop short of it."""

    min_free_mb: int | None = None
    """MiB kept free; None: 5% of the filesystem."""
    min_free_inodes: float = DEFAULT_FREE_FRACTION
    """The fraction of the filesystem's inodes kept free (filesystems without a fixed number: none)."""

    @classmethod
    def from_env(cls) -> StoreReserve:
        """The reserve ``$SANDRL_STORE_MIN_FREE_MB`` sets (MiB), else the default (5%)."""
        value = os.environ.get(MIN_FREE_ENV, "").strip()
        if not value:
            return cls()
        if not value.isdigit():
            raise ConfigError(f"${MIN_FREE_ENV}={value!r} is not a whole number of MiB")
        return cls(min_free_mb=int(value))

    def kept_bytes(self, st: os.statvfs_result) -> int:
        if self.min_free_mb is not None:
            return self.min_free_mb * _MIB
        return int(st.f_blocks * st.f_frsize * DEFAULT_FREE_FRACTION)

    def kept_inodes(self, st: os.statvfs_result) -> int:
        return int(st.f_files * self.min_free_inodes)

    def describe(self, st: os.statvfs_result) -> str:
        how = f"${MIN_FREE_ENV}" if self.min_free_mb is not None else f"5% of it; ${MIN_FREE_ENV} sets it"
        inodes = f" and {self.kept_inodes(st)} inodes" if st.f_files else ""
        return f"keeps {self.kept_bytes(st) // _MIB} MiB free ({how}){inodes}"


class LayerBudget:
    """What one new layer may still write into the store at ``store_dir`` (see the module).

    ``owner`` names the layer in errors ("sandbox sb-1's changes"); ``hint`` says what to do when
    it is over ``disk_mb`` or :func:`max_entries` (``disk_mb`` None: no such bound, only the
    store's reserve, depth and path length apply).
    """

    def __init__(
        self, store_dir: Path | str, reserve: StoreReserve, *, disk_mb: int | None, owner: str, hint: str
    ) -> None:
        self.store_dir = str(store_dir)
        self.reserve = reserve
        self.disk_mb = disk_mb
        self.owner = owner
        self.hint = hint
        self.max_bytes = None if disk_mb is None else disk_mb * _MIB
        self.max_entries = None if disk_mb is None else max_entries(disk_mb)
        self.written = 0
        self.entries = 0
        self._next_check = CHECK_EVERY_BYTES
        self._next_entries_check = CHECK_EVERY_ENTRIES
        self._room = 0
        self._stopped = False
        self._check_free()

    def stop(self) -> None:
        """Make the copy's next charge fail (its caller was cancelled): from any thread."""
        self._stopped = True

    # -- charging

    def charge(self, nbytes: int, entries: int = 0) -> None:
        """Count ``nbytes`` (as the store allocates them) and ``entries`` about to be written; raise if over."""
        self.written += nbytes
        self.entries += entries
        if self._stopped:
            raise SandboxError(f"{self.owner}: the copy into the image store was cancelled")
        if self.max_bytes is not None and self.written > self.max_bytes:
            raise LayerTooLargeError(
                f"{self.owner}: the layer would take more than disk_mb={self.disk_mb} ({_human(self.max_bytes)}) "
                "in the image store, which counts the blocks its data allocates (holes cost nothing) and a block "
                f"for each directory, large set of extended attributes and long symlink: refused, and nothing of "
                f"it kept; {self.hint}"
            )
        if self.max_entries is not None and self.entries > self.max_entries:
            raise self._too_many()
        if self.written > self._room:
            raise self._no_room(self.written)
        if self.written >= self._next_check or self.entries >= self._next_entries_check:
            self._next_check = self.written + CHECK_EVERY_BYTES
            self._next_entries_check = self.entries + CHECK_EVERY_ENTRIES
            self._check_free()

    def entry(self, name: str) -> None:
        """One entry named ``name`` in a directory of the layer: an inode and a directory entry."""
        self.charge((8 + len(name) + 3) & ~3, 1)

    def directory(self, path: str, name: str) -> None:
        """A directory at ``path`` (in the sandbox, or in the tree copied): its entry, its first block, its depth."""
        depth = sum(1 for part in path.split("/") if part)
        if depth > MAX_DEPTH or len(os.fsencode(path)) > MAX_PATH:
            raise LayerTooLargeError(
                f"{self.owner}: the layer has directories nested deeper than {MAX_DEPTH} levels or paths longer "
                f"than {MAX_PATH} bytes (at {_short(path)}): refused, and nothing of it kept; flatten or remove "
                "that tree before the snapshot or at the end of the build step"
            )
        self.entry(name)
        self.charge(BLOCK)

    def symlink(self, name: str, target: str) -> None:
        self.entry(name)
        if len(os.fsencode(target)) >= _FAST_SYMLINK:
            self.charge(BLOCK)

    def xattrs(self, nbytes: int) -> None:
        """Extended attributes of ``nbytes`` (names and values) on one entry."""
        if nbytes > _INODE_XATTR_ROOM:
            self.charge(_blocks(nbytes))

    # -- errors

    def file_too_large(self, path: str, size: int) -> LayerTooLargeError:
        """``path``'s apparent size is more than the store's filesystem holds in one file."""
        return LayerTooLargeError(
            f"{self.owner}: {path} has an apparent size of {_human(size)} (mostly holes), more than the image "
            f"store's filesystem at {self.store_dir} can hold in one file, even sparse: the layer is refused, "
            "and nothing of it kept; remove it or make it smaller (truncate) first"
        )

    def no_room(self) -> LayerTooLargeError:
        """The store's filesystem said it is full (ENOSPC) while the layer was written."""
        return self._no_room(self.written)

    def _too_many(self) -> LayerTooLargeError:
        return LayerTooLargeError(
            f"{self.owner}: the layer would hold more than {self.max_entries} files, directories and links "
            f"(a layer holds at most one per 4 KiB of disk_mb, and 65536 whatever the disk): refused, and "
            f"nothing of it kept; {self.hint}"
        )

    def _no_room(self, layer: int) -> LayerTooLargeError:
        try:
            st = os.statvfs(self.store_dir)
        except OSError as exc:
            return LayerTooLargeError(f"{self.owner}: the image store at {self.store_dir} cannot be read ({exc})")
        free = st.f_bavail * st.f_frsize
        return LayerTooLargeError(
            f"{self.owner}: the image store at {self.store_dir} has {free // _MIB} MiB free and {st.f_favail} "
            f"inodes, and sandrl {self.reserve.describe(st)}: a layer of {_human(layer)} or more does not fit, "
            "and nothing of it was kept; free space (`sandrl images prune`, remove snapshots) or lower the reserve"
        )

    def expect(self, nbytes: int, inodes: int) -> None:
        """Refuse at once a layer that cannot fit: the sandbox's disk holds ``nbytes`` of data in
        ``inodes`` (each one entry at least, but for a few of its overlays' own)."""
        if self.max_entries is not None and inodes > self.max_entries + _OVERLAY_INODES:
            raise self._too_many()
        if nbytes > self._room:
            raise self._no_room(nbytes)

    def _check_free(self) -> None:
        try:
            st = os.statvfs(self.store_dir)
        except OSError as exc:
            raise LayerTooLargeError(
                f"{self.owner}: the image store at {self.store_dir} cannot be read ({exc})"
            ) from exc
        room = st.f_bavail * st.f_frsize - self.reserve.kept_bytes(st)
        if room < 0 or (st.f_files and st.f_favail <= self.reserve.kept_inodes(st)):
            raise self._no_room(self.written)
        self._room = self.written + room


def _short(path: str, limit: int = 120) -> str:
    return path if len(path) <= limit else f"{path[:60]}...{path[-57:]}"


def copy_into_new(fin: int, st: os.stat_result, dst: str, budget: LayerBudget, shown: str) -> None:
    """Copy the open file ``fin`` (``st``: its ``fstat``) into ``dst``, a new file (never through a
    symlink, never over one; mode 0600 until its owner and mode are set), holes kept as holes, every
    block charged to ``budget`` before it is written. ``shown`` names the file in errors."""
    fout = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        size = st.st_size
        if st.st_blocks * 512 >= size:  # no hole: nearly every file
            budget.charge(_blocks(size))
            _send(fout, fin, 0, size)
            return
        try:
            _copy_data(fin, fout, size, budget)
            os.ftruncate(fout, size)  # the apparent size, and the holes at its end
        except OSError as exc:
            if exc.errno in (errno.EFBIG, errno.EINVAL):
                raise budget.file_too_large(shown, size) from exc
            raise
    finally:
        os.close(fout)


def _copy_data(fin: int, fout: int, size: int, budget: LayerBudget) -> None:
    """The data extents of a sparse file, each where it was; the holes between are never written."""
    pos = 0
    while pos < size:
        try:
            start = os.lseek(fin, pos, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # only a hole from here on
                return
            raise
        if start >= size:
            return
        end = min(os.lseek(fin, start, os.SEEK_HOLE), size)
        budget.charge(_blocks(end) - (start // BLOCK) * BLOCK)
        os.lseek(fout, start, os.SEEK_SET)
        _send(fout, fin, start, end - start)
        pos = end


def _send(fout: int, fin: int, offset: int, count: int) -> None:
    """``count`` bytes of ``fin`` from ``offset`` to ``fout``'s position; fewer if ``fin`` shrank meanwhile."""
    while count > 0:
        sent = os.sendfile(fout, fin, offset, min(count, 1 << 30))
        if sent == 0:
            return
        offset += sent
        count -= sent
