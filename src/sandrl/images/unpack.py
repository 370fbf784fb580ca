"""Unpack one image layer (a gzip, zstd or plain tar stream) into a new directory, in overlayfs's format.

A layer may be hostile; what it can do here is bounded. Nothing is written outside ``target``:
names are normalized (``a/../b`` is ``b``; absolute names land inside, as Docker has them), one
that climbs out refuses the layer, and every write is relative to a directory fd opened from the
root down with ``O_NOFOLLOW``, so no symlink is followed (``x -> /etc`` then ``x/passwd``);
symlink targets are stored verbatim for the sandbox to resolve. Owners, modes and xattrs go
through :class:`LayerPolicy`; files are made 0600, then get their owner, then their mode; devices
are left out. Content, entries and each entry's headers (2 MiB) are bounded, and decompressed data
is held a few MiB at a time. On any failure ``target`` is removed and :class:`LayerError` says why.

Whiteouts become overlayfs's: ``dir/.wh.name`` a character device 0/0, ``dir/.wh..wh..opq`` the
xattr ``trusted.overlay.opaque=y``. If the layer also holds ``dir/name``, that entry wins (the
whiteout is about the layers below) and a directory is made opaque; AUFS metadata is left out.

The diff_id hashes every byte of the uncompressed stream, what follows the tar's end included. A
cut gzip stream or tar is refused (a tar must end with its end-of-archive marker; an empty stream
is an empty layer); python-zstandard ends quietly at a cut, so a zstd stream cut in the tar's final
padding shows only as a diff_id that is not the image config's (the caller checks that).
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat
import tarfile
import zlib
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, BinaryIO, Self, cast

import zstandard

from sandrl.errors import LayerError

__all__ = ["LayerPolicy", "LayerStats", "unpack_layer"]

_GZIP, _ZSTD = b"\x1f\x8b", b"\x28\xb5\x2f\xfd"
_CHUNK = 1 << 20  # file content and decompressed data move in chunks of this size
_IN_CHUNK = 256 << 10  # compressed input is read in chunks of this size
_AHEAD = 4  # chunks decompressed ahead of the one tarfile reads
_TAR_BUFSIZE = 16 << 10  # tarfile's stream buffer: each small read copies what is left of it, so it stays small
_HEADER_BUDGET = 2 << 20  # what tarfile may read for one entry's headers (Go's archive/tar: 1 MiB per PAX header)
_MAX_NAME, _MAX_DEPTH, _MAX_SKIPPED, _MAX_SECONDS = 4096, 256, 20, 1 << 40
_OPAQUE, _XATTR = "trusted.overlay.opaque", "SCHILY.xattr."
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CORRUPT = (tarfile.TarError, EOFError, zlib.error, zstandard.ZstdError, ValueError, OverflowError, RecursionError)
"""What a broken stream raises: tarfile (also ValueError, and RecursionError on a long header chain), decompressors."""
_HOST_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.ENOMEM, errno.EMFILE, errno.ENFILE, errno.EROFS}
_REFUSED = "the image is broken or hostile and nothing of the layer is kept; use another image or ask its publisher"
_AGAIN = "pull it again; if it stays so, the registry serves a broken blob"


@dataclass(frozen=True)
class LayerPolicy:
    """How the layer's owners, modes and extended attributes become the ones on disk."""

    owner: Callable[[int], int]
    """A uid or gid in the tar (the sandbox's) -> the on-disk owner."""
    mode: Callable[[int], int]
    """An ``st_mode`` -> the ``st_mode`` the layer may hold (e.g. no setuid on files)."""
    keep_xattr: Callable[[str], bool]
    """Which extended attributes from the tar (PAX ``SCHILY.xattr.*``) are kept."""


@dataclass(frozen=True)
class LayerStats:
    diff_id: str
    """``sha256:<hex>`` of the whole uncompressed tar stream (OCI's diff_id)."""
    entries: int
    bytes: int
    """Bytes of file content written (a sparse file counts its full size)."""
    skipped: tuple[str, ...]
    """What was left out and why, e.g. ``dev/sda: block device left out`` (the first 20)."""


def unpack_layer(
    source: BinaryIO, target: Path, policy: LayerPolicy, *, max_bytes: int = 64 << 30, max_entries: int = 4_000_000
) -> LayerStats:
    """Unpack the layer blob ``source`` (gzip, zstd or plain tar) into the new directory ``target``.

    ``target`` must not exist (its parent must): an ``OSError`` from creating it is the caller's,
    raised as is, and leaves what is there alone. Anything else that goes wrong removes ``target``
    and raises :class:`LayerError`. See the module for what a layer may do.
    """
    os.mkdir(target, 0o700)
    opened: list[_TarStream | _Unpacker] = []
    try:
        opened.append(unpacker := _Unpacker(target, policy))
        opened.append(stream := _TarStream(source))
        entries = _unpack(stream, unpacker, max_bytes, max_entries)
        unpacker.finish()
        stream.drain(max_bytes - unpacker.consumed)
        stream.close()  # the worker has hashed all there is
        return LayerStats(f"sha256:{stream.sha256.hexdigest()}", entries, unpacker.written, tuple(unpacker.skipped))
    except BaseException as e:
        left = _remove(target)  # open fds below it are no matter
        if not isinstance(e, (LayerError, OSError, *_CORRUPT)):
            raise
        why = e.message if isinstance(e, LayerError) else _corrupt(e) if isinstance(e, _CORRUPT) else _host(e)
        raise LayerError(why + left) from e
    finally:
        for part in opened:
            part.close()


def _unpack(stream: _TarStream, unpacker: _Unpacker, max_bytes: int, max_entries: int) -> int:
    """Every entry of the tar stream into ``unpacker``; the number of entries."""
    if not stream.next_chunk():  # an empty stream: no tar at all
        return 0
    stream.budget = _HEADER_BUDGET
    with tarfile.open(fileobj=cast(BinaryIO, stream), mode="r|", bufsize=_TAR_BUFSIZE, tarinfo=_Member) as archive:
        data: Any = archive.fileobj  # tarfile's stream, which entry data is read from directly
        entries = pending = 0
        while True:
            stream.budget = _HEADER_BUDGET + pending  # tarfile skips what of the last entry's data was left unread
            member = archive.next()
            stream.budget = -1  # entry data is bounded by max_bytes instead
            if member is None:
                return entries
            vars(archive)["members"].clear()  # tarfile keeps every member it read; a layer may have millions
            entries += 1
            if entries > max_entries:
                raise _bound(f"more than {max_entries} entries", "max_entries")
            stored = _stored(member)
            unpacker.consumed += max(stored, member.size) if member.isreg() else stored
            if unpacker.consumed > max_bytes:
                raise _bound(f"more than {max_bytes} bytes of file content (at {member.name[:200]!r})", "max_bytes")
            if data.tell() != member.offset_data:
                data.seek(member.offset_data)
            try:
                unpacker.entry(member, data.read)
            except (OSError, ValueError, OverflowError) as e:  # not LayerError: that is no OSError
                if isinstance(e, OSError) and e.errno in _HOST_ERRORS:
                    raise LayerError(f"layer entry {member.name[:200]!r}: {_host(e)}") from e
                raise _refuse(member.name, e.strerror if isinstance(e, OSError) and e.strerror else str(e)) from e
            except _CORRUPT as e:
                raise LayerError(f"layer entry {member.name!r}: {_corrupt(e)}") from e
            pending = max(0, stored - (data.tell() - member.offset_data))


def _stored(member: tarfile.TarInfo) -> int:  # bytes of data after the header in the stream
    sparse = cast("list[tuple[int, int]] | None", member.sparse)
    if sparse is not None:
        return sum(length for _, length in sparse)
    if member.isreg() or member.type not in tarfile.SUPPORTED_TYPES:  # tarfile skips data of unknown types
        return member.size
    return 0


def _bound(what: str, bound: str) -> LayerError:
    return LayerError(f"the layer has {what}, over its bound {bound}; if the image really is this large, raise {bound}")


def _refuse(name: str, why: str) -> LayerError:
    return LayerError(f"layer entry {name[:200]!r}: {why}: {_REFUSED}")


def _host(e: BaseException) -> str:
    return f"the host failed unpacking it ({e}); nothing of the layer is kept: fix that and pull again"


def _corrupt(e: BaseException) -> str:
    detail = "a header chain too long" if isinstance(e, RecursionError) else f"{type(e).__name__}: {e}"
    return f"the layer is truncated or corrupt ({detail}); {_AGAIN}"


def _remove(target: Path) -> str:  # without following symlinks; '' or what is left to say
    try:
        shutil.rmtree(target)
    except OSError as e:
        return "" if isinstance(e, FileNotFoundError) else f" ({target} could not be removed: {e}; remove it by hand)"
    return ""


class _Member(tarfile.TarInfo):
    """A tar header: a broken one refuses the layer, where tarfile would take it for the archive's end."""

    @classmethod
    def fromtarfile(cls, archive: tarfile.TarFile) -> Self:
        try:
            return super().fromtarfile(archive)
        except tarfile.HeaderError as e:
            kind = type(e).__name__
            if kind == "EOFHeaderError":  # a zero block: the end-of-archive marker
                raise
            why = "the tar stream ends without its end-of-archive marker" if kind == "EmptyHeaderError" else str(e)
            raise LayerError(f"the layer is truncated or corrupt ({why}); {_AGAIN}") from None


class _TarStream:
    """The layer's tar stream as tarfile reads it, decompressed and hashed; ``budget`` bytes more (-1: any)."""

    def __init__(self, source: BinaryIO) -> None:
        head = b""
        while len(head) < 4 and (more := source.read(4 - len(head))):
            head += more
        self._head, self._source = head, source
        self._fill: Callable[[], bytes] = lambda: self._raw(_CHUNK)
        if head.startswith(_GZIP):
            self._inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
            self._fill = self._gunzip
        elif head.startswith(_ZSTD):
            dctx = zstandard.ZstdDecompressor()
            raw = cast(BinaryIO, SimpleNamespace(read=self._raw))
            reader = dctx.stream_reader(raw, read_size=_IN_CHUNK, read_across_frames=True)
            self._fill = lambda: reader.read(_CHUNK)
        self.sha256 = hashlib.sha256()
        self.budget = -1
        self._buf, self._pos, self._eof = b"", 0, False
        self._pool = ThreadPoolExecutor(1, "sandrl-layer")  # one worker: chunks are made and hashed in order
        self._ahead: deque[Future[bytes]] = deque()

    def _produce(self) -> bytes:
        """The next chunk, decompressed and hashed on the worker (zlib, zstd, sha256 let go of the GIL)."""
        chunk = self._fill()
        self.sha256.update(chunk)
        return chunk

    def close(self) -> None:
        """Wait for the worker (it may be reading ``source``, which is the caller's again after this)."""
        self._pool.shutdown(cancel_futures=True)

    def _raw(self, size: int = -1, /) -> bytes:  # the bytes sniffed for the compression, then the rest
        if self._head:
            head, self._head = self._head, b""
            return head
        return self._source.read(size)

    def _gunzip(self) -> bytes:
        while True:
            inflate = self._inflate
            if inflate.eof:  # the end of a gzip member: another may follow
                data = inflate.unused_data or self._raw(_IN_CHUNK)
                if not data:
                    return b""
                inflate = self._inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
            elif not (data := inflate.unconsumed_tail or self._raw(_IN_CHUNK)):
                out = inflate.flush()  # what zlib held back for want of room (at most a window)
                if not inflate.eof:
                    raise LayerError(f"the layer is truncated (its gzip stream ends early); {_AGAIN}")
                if out:
                    return out
                continue
            if out := inflate.decompress(data, _CHUNK):
                return out

    def read(self, size: int = -1, /) -> bytes:
        """Up to ``size`` bytes (tarfile asks for its buffer size); b'' at the end."""
        if self._pos >= len(self._buf) and not self.next_chunk():
            return b""
        data = self._buf[self._pos : len(self._buf) if size < 0 else self._pos + size]
        self._pos += len(data)
        if self.budget >= 0:
            self.budget -= len(data)
            if self.budget < 0:
                raise LayerError(f"the layer has a tar header (PAX, long name) of more than 2 MiB: {_REFUSED}")
        return data

    def next_chunk(self) -> bool:
        if self._eof:
            return False
        while len(self._ahead) < _AHEAD:
            self._ahead.append(self._pool.submit(self._produce))
        self._eof = True  # until the chunk is here: after a failed one, nothing
        self._buf, self._pos = self._ahead.popleft().result(), 0
        self._eof = not self._buf
        return not self._eof

    def drain(self, allowed: int) -> None:
        """Hash what follows the end-of-archive marker, up to ``allowed`` bytes."""
        left = len(self._buf) - self._pos
        while self.next_chunk():
            left += len(self._buf)
            if left > allowed:
                raise _bound("data after its tar's end that makes more than max_bytes with its content", "max_bytes")


@dataclass(slots=True)
class _Dir:
    """A directory's metadata, applied once it has all its entries; ``ino`` is the directory it is for."""

    uid: int
    gid: int
    mode: int
    mtime_ns: int | None
    xattrs: list[tuple[str, bytes]] = field(default_factory=list)
    ino: int = 0


class _Unpacker:
    """Writes entries below the layer's root fd, never through a symlink."""

    def __init__(self, target: Path, policy: LayerPolicy) -> None:
        self.root = os.open(target, _DIR_FLAGS)
        self.owner, self.mode, self.keep_xattr = policy.owner, policy.mode, policy.keep_xattr
        self.written = self.consumed = 0
        self.skipped: list[str] = []
        self.name = ""
        top = policy.owner(0)
        self.dirs: dict[tuple[str, ...], _Dir] = {(): _Dir(top, top, 0o755, None, ino=os.fstat(self.root).st_ino)}
        self._chain: tuple[str, ...] = ()  # the directory last written to, with the fds of it and its parents
        self._fds: list[int] = []

    def close(self) -> None:
        fds = [*self._fds, self.root] if self.root >= 0 else self._fds
        self._fds, self._chain, self.root = [], (), -1
        for fd in fds:
            os.close(fd)

    def skip(self, why: str) -> None:
        if len(self.skipped) < _MAX_SKIPPED:
            self.skipped.append(why)

    def directory(self, parts: tuple[str, ...], create: bool = True) -> int:
        """The fd of directory ``parts`` (kept open for the next entry); missing ones are made if ``create``."""
        chain, fds = self._chain, self._fds
        if parts == chain:
            return fds[-1] if fds else self.root
        same, limit = 0, min(len(chain), len(parts))
        while same < limit and chain[same] == parts[same]:
            same += 1
        while len(fds) > same:
            os.close(fds.pop())
        self._chain = parts[:same]
        fd = fds[-1] if fds else self.root
        for i in range(same, len(parts)):
            fd = self._open_dir(fd, parts, i, create)
            fds.append(fd)
            self._chain = parts[: i + 1]
        return fd

    def _open_dir(self, parent: int, parts: tuple[str, ...], i: int, create: bool) -> int:
        name = parts[i]
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                raise
            os.mkdir(name, 0o700, dir_fd=parent)
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
            top = self.owner(0)
            self.dirs[parts[: i + 1]] = _Dir(top, top, 0o755, None, ino=os.fstat(fd).st_ino)
            return fd
        except OSError as e:
            if not create or e.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            where = "/".join(parts[: i + 1])
            if stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
                raise _refuse(self.name, f"writes through the symlink {where!r}") from None
            raise _refuse(self.name, f"{where!r} is not a directory") from None

    def finish(self) -> None:
        """Give every directory its metadata, children first (a 0555 directory took entries until now)."""
        for parts in sorted(self.dirs, reverse=True):
            meta = self.dirs[parts]
            try:
                fd = self.directory(parts, create=False)
            except OSError:
                continue  # replaced by a later entry
            if os.fstat(fd).st_ino != meta.ino:
                continue
            os.fchown(fd, meta.uid, meta.gid)
            os.fchmod(fd, meta.mode)
            self._set_xattrs(fd, meta.xattrs, "/".join(parts) or ".")
            if meta.mtime_ns is not None:
                os.utime(fd, ns=(meta.mtime_ns, meta.mtime_ns))

    def entry(self, member: tarfile.TarInfo, read: Callable[[int], bytes]) -> None:
        self.name = name = member.name  # for what _open_dir refuses
        kind, parts = member.type, _parts(name)
        if not parts:
            if kind != tarfile.DIRTYPE:
                raise _refuse(name, "the layer's root is not a directory")
            self.dirs[()] = self._dir_meta(member, self.dirs[()].ino)
            return
        if ".wh." in name and self._whiteout(parts):
            return
        if not member.isreg() and kind not in (tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.FIFOTYPE):
            what = {tarfile.CHRTYPE: "character device", tarfile.BLKTYPE: "block device"}.get(kind, f"type {kind!r}")
            self.skip(f"{'/'.join(parts)}: {what} left out")  # devices do nothing in a nodev mount anyway
            return
        parent, base = self.directory(parts[:-1]), parts[-1]
        if member.isreg():
            self._file(parent, base, member, read)
        elif kind == tarfile.DIRTYPE:
            self._mkdir(parent, base, parts, member)
        elif kind == tarfile.LNKTYPE:
            self._hardlink(parent, base, parts, member)
        elif kind == tarfile.SYMTYPE:
            if "\0" in member.linkname:
                raise _refuse(name, "a symlink target with a NUL byte")
            self._make(parent, base, lambda: os.symlink(member.linkname, base, dir_fd=parent))
            self._meta_at(parent, base, member, stat.S_IFLNK)
        else:
            self._make(parent, base, lambda: os.mkfifo(base, 0o600, dir_fd=parent))
            self._meta_at(parent, base, member, stat.S_IFIFO)

    def _file(self, parent: int, base: str, member: tarfile.TarInfo, read: Callable[[int], bytes]) -> None:
        try:
            fd = os.open(base, _FILE_FLAGS, 0o600, dir_fd=parent)
        except FileExistsError:
            self._make_room(parent, base, False)
            fd = os.open(base, _FILE_FLAGS, 0o600, dir_fd=parent)
        try:
            sparse = cast("list[tuple[int, int]] | None", member.sparse)
            if sparse is None:
                _copy(read, fd, member.size)
            else:  # only the data is written: the holes stay holes
                for offset, length in sparse:
                    os.lseek(fd, offset, os.SEEK_SET)
                    _copy(read, fd, length)
                os.ftruncate(fd, member.size)
            self.written += member.size
            os.fchown(fd, self.owner(member.uid), self.owner(member.gid))
            os.fchmod(fd, stat.S_IMODE(self.mode(stat.S_IFREG | stat.S_IMODE(member.mode))))
            if member.pax_headers:
                self._set_xattrs(fd, self._xattrs(member), member.name)
            mtime = _ns(member.mtime)
            os.utime(fd, ns=(mtime, mtime))
        finally:
            os.close(fd)

    def _mkdir(self, parent: int, base: str, parts: tuple[str, ...], member: tarfile.TarInfo) -> None:
        replaced = ""
        try:
            os.mkdir(base, 0o700, dir_fd=parent)
        except FileExistsError:
            replaced = self._make_room(parent, base, True)
            if replaced == "dir":  # two directories: the later one's metadata, for the same directory
                old = self.dirs.get(parts)
                ino = old.ino if old else os.stat(base, dir_fd=parent, follow_symlinks=False).st_ino
                self.dirs[parts] = self._dir_meta(member, ino)
                return
            os.mkdir(base, 0o700, dir_fd=parent)
        self.dirs[parts] = self._dir_meta(member, os.stat(base, dir_fd=parent, follow_symlinks=False).st_ino)
        if replaced == "whiteout":
            self._opaque(parent, base)

    def _hardlink(self, parent: int, base: str, parts: tuple[str, ...], member: tarfile.TarInfo) -> None:
        try:
            target = _parts(member.linkname)
        except LayerError as e:
            raise _refuse(member.name, f"a hard link whose target is refused ({e.message})") from None
        missing = _refuse(member.name, f"hard link to {'/'.join(target)!r}, which this layer does not hold")
        if not target:
            raise missing
        if target == parts:
            return
        source = parent if target[:-1] == parts[:-1] else self.root
        try:
            for i, component in enumerate(target[:-1] if source == self.root else ()):
                fd = os.open(component, _DIR_FLAGS, dir_fd=source)  # never through a symlink either
                if i:
                    os.close(source)
                source = fd
            name = target[-1]
            if not stat.S_ISREG(os.stat(name, dir_fd=source, follow_symlinks=False).st_mode):
                raise missing
            link = lambda: os.link(name, base, src_dir_fd=source, dst_dir_fd=parent, follow_symlinks=False)  # noqa: E731
            self._make(parent, base, link)
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):  # missing, or (behind) a symlink
                raise missing from e
            raise
        finally:
            if source not in (self.root, parent):
                os.close(source)

    def _whiteout(self, parts: tuple[str, ...]) -> bool:
        """Handle ``parts`` if it is a whiteout or AUFS metadata; False when it is an ordinary entry."""
        base, where = parts[-1], "/".join(parts)
        if any(p.startswith(".wh..wh.") for p in parts if p != ".wh..wh..opq") or ".wh..wh..opq" in parts[:-1]:
            self.skip(f"{where}: AUFS metadata left out")
            return True
        if not base.startswith(".wh."):
            return False
        parent = self.directory(parts[:-1])
        if base == ".wh..wh..opq":
            os.setxattr(parent, _OPAQUE, b"y")
            return True
        real = base[4:]
        if real in ("", ".", ".."):
            raise _refuse(where, f"a whiteout of {real!r}, which is no name")
        try:
            os.mknod(real, stat.S_IFCHR, os.makedev(0, 0), dir_fd=parent)
        except FileExistsError:  # this layer's own entry wins: the whiteout is about the layers below
            if stat.S_ISDIR(os.stat(real, dir_fd=parent, follow_symlinks=False).st_mode):
                self._opaque(parent, real)
            return True
        top = self.owner(0)
        os.chown(real, top, top, dir_fd=parent, follow_symlinks=False)
        return True

    def _make(self, parent: int, base: str, make: Callable[[], None]) -> None:
        """``make()`` a non-directory, replacing what this layer already has at ``base``."""
        try:
            make()
        except FileExistsError:
            self._make_room(parent, base, False)
            make()

    def _make_room(self, parent: int, base: str, is_dir: bool) -> str:
        """Clear ``base`` for a later entry of that name; what was there: 'dir' (kept if ``is_dir``), 'whiteout'..."""
        mode = os.stat(base, dir_fd=parent, follow_symlinks=False).st_mode
        if stat.S_ISDIR(mode):
            if is_dir:
                return "dir"
            shutil.rmtree(base, dir_fd=parent)  # never follows symlinks
            return "tree"
        os.unlink(base, dir_fd=parent)
        return "whiteout" if stat.S_ISCHR(mode) else "file"  # no other device is ever made

    def _opaque(self, parent: int, base: str) -> None:
        fd = os.open(base, _DIR_FLAGS, dir_fd=parent)
        try:
            os.setxattr(fd, _OPAQUE, b"y")
        finally:
            os.close(fd)

    def _dir_meta(self, member: tarfile.TarInfo, ino: int) -> _Dir:
        mode = stat.S_IMODE(self.mode(stat.S_IFDIR | stat.S_IMODE(member.mode)))
        owner = self.owner
        return _Dir(owner(member.uid), owner(member.gid), mode, _ns(member.mtime), self._xattrs(member), ino)

    def _meta_at(self, parent: int, base: str, member: tarfile.TarInfo, kind: int) -> None:
        """Owner, mode, xattrs and mtime of the symlink or FIFO ``base`` just made."""
        os.chown(base, self.owner(member.uid), self.owner(member.gid), dir_fd=parent, follow_symlinks=False)
        if kind != stat.S_IFLNK:  # a FIFO this call made: nothing to follow
            os.chmod(base, stat.S_IMODE(self.mode(kind | stat.S_IMODE(member.mode))), dir_fd=parent)
        if member.pax_headers and (xattrs := self._xattrs(member)):
            self._set_xattrs(f"/proc/self/fd/{parent}/{base}", xattrs, member.name)
        mtime = _ns(member.mtime)
        os.utime(base, ns=(mtime, mtime), dir_fd=parent, follow_symlinks=False)

    def _xattrs(self, member: tarfile.TarInfo) -> list[tuple[str, bytes]]:
        keep, n = self.keep_xattr, len(_XATTR)
        return [
            (key[n:], value.encode("utf-8", "surrogateescape"))  # the bytes tarfile decoded the value from
            for key, value in member.pax_headers.items()
            if key.startswith(_XATTR) and keep(key[n:])
        ]

    def _set_xattrs(self, where: int | str, xattrs: list[tuple[str, bytes]], name: str) -> None:
        for key, value in xattrs:
            try:  # an fd, or a path through /proc/self/fd/ whose last component is not followed
                os.setxattr(where, key, value, follow_symlinks=isinstance(where, int))
            except OSError as e:
                if e.errno not in (errno.EPERM, errno.ENOTSUP):  # not on this file system, or this kind of file
                    raise
                self.skip(f"{name}: extended attribute {key} left out ({e.strerror})")


def _parts(name: str) -> tuple[str, ...]:
    """The components of the entry name ``name`` below the layer's root; LayerError if it leaves the root."""
    if "\0" in name:
        raise _refuse(name, "a name with a NUL byte")
    if len(name) > _MAX_NAME // 4 and len(name.encode("utf-8", "surrogateescape")) > _MAX_NAME:
        raise _refuse(name, f"a name longer than {_MAX_NAME} bytes")
    parts: list[str] = []
    for part in name.split("/"):
        if part == "..":
            if not parts:
                raise _refuse(name, "the name leads out of the layer's root")
            parts.pop()
        elif part and part != ".":
            parts.append(part)
    if len(parts) > _MAX_DEPTH:
        raise _refuse(name, f"more than {_MAX_DEPTH} directories deep")
    return tuple(parts)


def _copy(read: Callable[[int], bytes], fd: int, size: int) -> None:
    while size > 0:
        chunk = read(min(size, _CHUNK))
        if not chunk:
            raise EOFError("the stream ends inside a file's content")
        size -= len(chunk)
        done = os.write(fd, chunk)
        while done < len(chunk):
            done += os.write(fd, memoryview(chunk)[done:])


def _ns(mtime: float) -> int:
    """A tar mtime in nanoseconds, within what a timestamp can hold."""
    try:
        seconds = min(max(mtime, -_MAX_SECONDS), _MAX_SECONDS)
        return seconds * 1_000_000_000 if isinstance(seconds, int) else round(seconds * 1e9)
    except (OverflowError, ValueError):  # inf or nan from a PAX header
        return 0
