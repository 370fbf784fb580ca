"""unpack_layer: real layers built with tarfile, unpacked into real directories, hostile ones refused.

Tests that chown to other users, make whiteout devices or set ``trusted.*`` xattrs need root;
the others use a policy that keeps the caller's own owner (``-1``: fchown leaves it) and run as anyone.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import io
import os
import shutil
import stat
import subprocess
import tarfile
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import zstandard

from sandrl.errors import LayerError
from sandrl.images.unpack import LayerPolicy, LayerStats, unpack_layer

ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="chown to other owners, mknod and trusted.* xattrs need root")


def _no_setid(mode: int) -> int:
    return mode if stat.S_ISDIR(mode) else mode & ~0o6000


STORE = LayerPolicy(owner=lambda i: 100000 + i, mode=_no_setid, keep_xattr=lambda name: name.startswith("user."))
"""Like the image store's: owners shifted, no setuid/setgid on files, only user.* xattrs."""
MINE = LayerPolicy(owner=lambda i: -1, mode=_no_setid, keep_xattr=lambda name: name.startswith("user."))
"""Owners left as the caller's (fchown(-1, -1) changes nothing): runs without root."""

Entry = tuple[tarfile.TarInfo, bytes | None]


def _info(name: str, kind: bytes, **fields: object) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mtime = 1_600_000_000
    for key, value in fields.items():
        setattr(info, key, value)
    return info


def reg(name: str, data: bytes = b"", **fields: object) -> Entry:
    return _info(name, tarfile.REGTYPE, **{"size": len(data), "mode": 0o644, **fields}), data


def dir_(name: str, **fields: object) -> Entry:
    return _info(name, tarfile.DIRTYPE, **{"mode": 0o755, **fields}), None


def sym(name: str, target: str, **fields: object) -> Entry:
    return _info(name, tarfile.SYMTYPE, **{"linkname": target, "mode": 0o777, **fields}), None


def link(name: str, target: str) -> Entry:
    return _info(name, tarfile.LNKTYPE, linkname=target, mode=0o644), None


def tar(*entries: Entry, fmt: int = tarfile.PAX_FORMAT) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as archive:
        for info, data in entries:
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def _no_worker_left() -> None:
    assert not [t for t in threading.enumerate() if t.name.startswith("sandrl-layer")], "the decompressing thread ended"


def unpack(tmp_path: Path, blob: bytes, policy: LayerPolicy = MINE, **bounds: int) -> tuple[Path, LayerStats]:
    target = tmp_path / "layer"
    stats = unpack_layer(io.BytesIO(blob), target, policy, **bounds)
    _no_worker_left()
    return target, stats


def refused(tmp_path: Path, blob: bytes, match: str, policy: LayerPolicy = MINE, **bounds: int) -> LayerError:
    target = tmp_path / "layer"
    with pytest.raises(LayerError, match=match) as caught:
        unpack_layer(io.BytesIO(blob), target, policy, **bounds)
    assert not os.path.lexists(target), "a refused layer leaves nothing behind"
    _no_worker_left()
    return caught.value


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


# -- round trips -------------------------------------------------------------------------------


@ROOT
def test_a_layer_round_trips_with_owners_modes_and_times_through_the_policy(tmp_path: Path) -> None:
    big = os.urandom(3 << 20)
    blob = tar(
        dir_("./", mode=0o750, uid=7, gid=8, mtime=1000),
        dir_("etc/", mtime=2000),
        reg("etc/hosts", b"127.0.0.1 localhost\n", uid=3, gid=4, mtime=3000),
        reg("usr/bin/tool", big, mode=0o755, mtime=4000),  # its parents are not in the tar
        sym("usr/bin/alias", "/usr/bin/tool", uid=5, gid=6, mtime=5000),
        dir_("ro/", mode=0o555, mtime=6000),  # read-only, yet it takes the entry below
        reg("ro/inside", b"x"),
    )
    target, stats = unpack(tmp_path, blob, STORE)
    assert stats == LayerStats(sha256(blob), 7, len(big) + 21, ())
    top = target.lstat()
    assert (stat.S_IMODE(top.st_mode), top.st_uid, top.st_gid, top.st_mtime) == (0o750, 100007, 100008, 1000)
    hosts = (target / "etc/hosts").lstat()
    assert (target / "etc/hosts").read_bytes() == b"127.0.0.1 localhost\n"
    assert (stat.S_IMODE(hosts.st_mode), hosts.st_uid, hosts.st_gid, hosts.st_mtime) == (0o644, 100003, 100004, 3000)
    assert (target / "etc").stat().st_mtime == 2000, "directory times are set after their entries"
    assert (target / "usr/bin/tool").read_bytes() == big
    assert stat.S_IMODE((target / "usr/bin/tool").stat().st_mode) == 0o755
    implicit = (target / "usr").lstat()
    assert (stat.S_IMODE(implicit.st_mode), implicit.st_uid, implicit.st_gid) == (0o755, 100000, 100000)
    alias = (target / "usr/bin/alias").lstat()
    assert os.readlink(target / "usr/bin/alias") == "/usr/bin/tool", "symlink targets are stored verbatim"
    assert (alias.st_uid, alias.st_gid, alias.st_mtime) == (100005, 100006, 5000)
    ro = (target / "ro").lstat()
    assert (stat.S_IMODE(ro.st_mode), ro.st_mtime) == (0o555, 6000)
    assert (target / "ro/inside").read_bytes() == b"x"


@ROOT
def test_without_a_root_entry_the_root_is_0755_and_owned_by_sandbox_root(tmp_path: Path) -> None:
    target, _ = unpack(tmp_path, tar(reg("f", b"1")), STORE)
    top = target.lstat()
    assert (stat.S_IMODE(top.st_mode), top.st_uid, top.st_gid) == (0o755, 100000, 100000)


@pytest.mark.parametrize("compress", ["plain", "gzip", "zstd", "gzip members", "zstd frames"])
def test_compression_is_detected_and_the_diff_id_is_the_uncompressed_streams(tmp_path: Path, compress: str) -> None:
    data = os.urandom(200_000) + b"\0" * 2_000_000
    blob = tar(dir_("d/"), reg("d/f", data), reg("d/g", b"small"))
    half = len(blob) // 2
    packed = {
        "plain": lambda: blob,
        "gzip": lambda: gzip.compress(blob),
        "zstd": lambda: zstandard.ZstdCompressor().compress(blob),
        "gzip members": lambda: gzip.compress(blob[:half]) + gzip.compress(blob[half:]),
        "zstd frames": lambda: b"".join(zstandard.ZstdCompressor().compress(p) for p in (blob[:half], blob[half:])),
    }[compress]()
    target, stats = unpack(tmp_path, packed)
    assert stats.diff_id == sha256(blob)
    assert (stats.entries, stats.bytes) == (3, len(data) + 5)
    assert (target / "d/f").read_bytes() == data
    assert (target / "d/g").read_bytes() == b"small"


def test_the_diff_id_covers_what_follows_the_end_of_the_archive(tmp_path: Path) -> None:
    blob = tar(reg("f", b"x")) + b"\0" * 30_000
    _, stats = unpack(tmp_path, gzip.compress(blob))
    assert stats.diff_id == sha256(blob)


def test_an_empty_stream_is_an_empty_layer(tmp_path: Path) -> None:
    target, stats = unpack(tmp_path, b"")
    assert stats == LayerStats(sha256(b""), 0, 0, ())
    assert list(target.iterdir()) == []
    shutil.rmtree(target)
    zeros = b"\0" * 1024  # the empty layer registries serve: a tar of no entries, gzipped
    _, stats = unpack(tmp_path, gzip.compress(zeros))
    assert stats == LayerStats(sha256(zeros), 0, 0, ())


def test_long_names_and_pax_and_gnu_headers(tmp_path: Path) -> None:
    deep = "/".join(["directory-with-a-long-name"] * 8) + "/file"
    for fmt in (tarfile.PAX_FORMAT, tarfile.GNU_FORMAT):
        out = tmp_path / str(fmt)
        out.mkdir()
        target, _ = unpack(out, tar(reg(deep, b"deep"), sym("s", "x" * 300), fmt=fmt))
        assert (target / deep).read_bytes() == b"deep"
        assert os.readlink(target / "s") == "x" * 300


@pytest.mark.skipif(shutil.which("tar") is None, reason="GNU tar makes the sparse archives")
@pytest.mark.parametrize("flags", [["--format=gnu"], ["--format=posix", "--sparse-version=1.0"]])
def test_sparse_files_keep_their_holes(tmp_path: Path, flags: list[str]) -> None:
    src = tmp_path / "src"
    src.mkdir()
    with open(src / "sparse", "wb") as f:
        f.write(b"head")
        f.seek(8 << 20)
        f.write(b"middle")
        f.truncate(16 << 20)
    command = ["tar", "-C", str(src), "--sparse", *flags, "-cf", "-", "sparse"]
    blob = subprocess.run(command, check=True, capture_output=True).stdout
    target, stats = unpack(tmp_path, blob)
    assert (target / "sparse").read_bytes() == (src / "sparse").read_bytes()
    assert stats.bytes == 16 << 20
    assert (target / "sparse").stat().st_blocks * 512 < 1 << 20


# -- whiteouts ---------------------------------------------------------------------------------


def _is_whiteout(path: Path) -> bool:
    st = path.lstat()
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0 and stat.S_IMODE(st.st_mode) == 0


@ROOT
def test_a_whiteout_is_a_character_device_0_0_of_sandbox_root(tmp_path: Path) -> None:
    target, stats = unpack(tmp_path, tar(dir_("etc/"), reg("etc/.wh.motd"), reg(".wh.gone")), STORE)
    assert _is_whiteout(target / "etc/motd") and _is_whiteout(target / "gone")
    assert (target / "gone").lstat().st_uid == 100000
    assert not (target / "etc/.wh.motd").exists()
    assert stats.entries == 3


@ROOT
def test_an_opaque_marker_sets_the_overlay_xattr_and_keeps_the_layers_own_entries(tmp_path: Path) -> None:
    blob = tar(dir_("a/"), reg("a/kept"), reg("a/.wh..wh..opq"), reg("new/.wh..wh..opq"))
    target, _ = unpack(tmp_path, blob, STORE)
    assert os.getxattr(target / "a", "trusted.overlay.opaque") == b"y"
    assert os.getxattr(target / "new", "trusted.overlay.opaque") == b"y", "the directory is made for it"
    assert (target / "a/kept").exists()
    assert not (target / "a/.wh..wh..opq").exists()


@ROOT
def test_the_layers_own_entry_wins_over_a_whiteout_of_its_name_in_either_order(tmp_path: Path) -> None:
    blob = tar(
        reg("before", b"real"),
        reg(".wh.before"),
        reg(".wh.after"),
        reg("after", b"real too"),
        dir_("dir-before/"),
        reg("dir-before/x"),
        reg(".wh.dir-before"),
        reg(".wh.dir-after"),
        dir_("dir-after/"),
    )
    target, _ = unpack(tmp_path, blob, STORE)
    assert (target / "before").read_bytes() == b"real"
    assert (target / "after").read_bytes() == b"real too"
    for name in ("dir-before", "dir-after"):  # the lower directory of that name was deleted: nothing of it shows
        assert (target / name).is_dir() and os.getxattr(target / name, "trusted.overlay.opaque") == b"y"
    assert (target / "dir-before/x").exists()


@ROOT
def test_aufs_metadata_is_left_out(tmp_path: Path) -> None:
    blob = tar(dir_(".wh..wh.plnk/"), reg(".wh..wh.plnk/1.2", b"x"), reg(".wh..wh.aufs"), reg("f"))
    target, stats = unpack(tmp_path, blob, STORE)
    assert sorted(p.name for p in target.iterdir()) == ["f"]
    assert ".wh..wh.aufs: AUFS metadata left out" in stats.skipped


def test_a_whiteout_of_no_name_is_refused(tmp_path: Path) -> None:
    refused(tmp_path, tar(reg("d/.wh.")), "whiteout of ''")


# -- hard links, devices, modes, xattrs --------------------------------------------------------


def test_hard_links_share_the_inode_of_an_earlier_file_of_the_layer(tmp_path: Path) -> None:
    blob = tar(reg("bin/perl", b"#!perl"), link("bin/perl5", "bin/perl"), link("other/p", "/bin/perl"))
    target, _ = unpack(tmp_path, blob)
    inode = (target / "bin/perl").stat().st_ino
    assert (target / "bin/perl5").stat().st_ino == inode == (target / "other/p").stat().st_ino
    assert (target / "bin/perl").stat().st_nlink == 3


@pytest.mark.parametrize(
    ("entries", "why"),
    [
        ([link("h", "missing")], "hard link to 'missing', which this layer does not hold"),
        ([link("h", "/etc/passwd")], "hard link to 'etc/passwd', which this layer does not hold"),
        ([link("h", "../../etc/passwd")], "hard link whose target is refused"),
        ([reg("f"), link("../x", "f")], "leads out of the layer's root"),
        ([sym("s", "f"), reg("f"), link("h", "s")], "hard link to 's', which"),  # a symlink is no file
        ([sym("etc", "/etc"), link("h", "etc/passwd")], "hard link to 'etc/passwd', which"),  # nor leads to one
        ([dir_("d/"), link("h", "d")], "hard link to 'd', which"),
    ],
)
def test_a_hard_link_to_anything_but_an_earlier_file_of_the_layer_is_refused(
    tmp_path: Path, entries: list[Entry], why: str
) -> None:
    links = os.stat("/etc/passwd").st_nlink
    refused(tmp_path, tar(*entries), why)
    assert os.stat("/etc/passwd").st_nlink == links


@ROOT
def test_devices_are_left_out_and_fifos_made(tmp_path: Path) -> None:
    blob = tar(
        (_info("dev/sda", tarfile.BLKTYPE, devmajor=8, devminor=0, mode=0o660), None),
        (_info("dev/null", tarfile.CHRTYPE, devmajor=1, devminor=3, mode=0o666), None),
        (_info("run/fifo", tarfile.FIFOTYPE, mode=0o620, uid=9), None),
        (_info("odd", b"Z", mode=0o644), None),
    )
    target, stats = unpack(tmp_path, blob, STORE)
    assert stats.skipped == (
        "dev/sda: block device left out",
        "dev/null: character device left out",
        "odd: type b'Z' left out",
    )
    assert not (target / "dev/sda").exists() and not (target / "dev/null").exists()
    fifo = (target / "run/fifo").lstat()
    assert stat.S_ISFIFO(fifo.st_mode) and stat.S_IMODE(fifo.st_mode) == 0o620 and fifo.st_uid == 100009


@ROOT
def test_the_policy_strips_setuid_and_setgid_from_files(tmp_path: Path) -> None:
    blob = tar(reg("su", b"x", mode=0o4755), reg("sg", b"x", mode=0o2755), dir_("shared/", mode=0o2775))
    target, _ = unpack(tmp_path, blob, STORE)
    assert stat.S_IMODE((target / "su").stat().st_mode) == 0o755
    assert stat.S_IMODE((target / "sg").stat().st_mode) == 0o755
    assert stat.S_IMODE((target / "shared").stat().st_mode) == 0o2775


def test_extended_attributes_are_kept_only_as_the_policy_says(tmp_path: Path) -> None:
    xattrs = {
        "SCHILY.xattr.user.keep": "kept",
        "SCHILY.xattr.user.drop": "dropped",
        "SCHILY.xattr.security.capability": "\x01\x00\x00\x02",
        "SCHILY.xattr.system.posix_acl_access": "\x02\x00\x00\x00",
    }
    policy = LayerPolicy(owner=lambda i: -1, mode=_no_setid, keep_xattr=lambda name: name == "user.keep")
    target, stats = unpack(tmp_path, tar(reg("f", b"x", pax_headers=xattrs), dir_("d/", pax_headers=xattrs)), policy)
    for path in (target / "f", target / "d"):
        assert os.listxattr(path) == ["user.keep"]
        assert os.getxattr(path, "user.keep") == b"kept"
    assert stats.skipped == ()


@ROOT
def test_a_symlinks_extended_attributes_go_on_the_link_never_its_target(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_text("x")
    xattrs = {"SCHILY.xattr.user.a": "1", "SCHILY.xattr.trusted.b": "2"}
    policy = LayerPolicy(owner=lambda i: -1, mode=_no_setid, keep_xattr=lambda name: True)
    target, stats = unpack(tmp_path, tar(sym("s", str(outside), pax_headers=xattrs)), policy)
    assert os.listxattr(target / "s", follow_symlinks=False) == ["trusted.b"]
    assert stats.skipped == ("s: extended attribute user.a left out (Operation not permitted)",)  # Linux: no user.*
    assert os.listxattr(outside) == []


# -- hostile layers ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["../../etc/x", "a/../../x", "./../x", "a/b/../../../x", ".."])
def test_a_name_that_leaves_the_root_is_refused(tmp_path: Path, name: str) -> None:
    error = refused(tmp_path, tar(reg("fine"), reg(name, b"evil")), "leads out of the layer's root")
    assert name in error.message
    assert not (tmp_path / "x").exists()


def test_absolute_and_dotted_names_land_inside(tmp_path: Path) -> None:
    target, _ = unpack(tmp_path, tar(reg("/abs/path", b"1"), reg("a/../b", b"2"), reg("./c/./d", b"3")))
    assert (target / "abs/path").read_bytes() == b"1"
    assert (target / "b").read_bytes() == b"2"
    assert (target / "c/d").read_bytes() == b"3"
    assert not (target / "a").exists()


@pytest.mark.parametrize(
    "planted",
    [
        lambda outside: [sym("x", str(outside)), reg("x/evil", b"evil")],
        lambda outside: [dir_("a/"), sym("a/s", str(outside)), reg("a/s/evil", b"evil")],
        lambda outside: [reg("x", b"file first"), sym("x", str(outside)), reg("x/evil", b"evil")],
        lambda outside: [sym("x", str(outside)), dir_("x/sub/")],
        lambda outside: [sym("x", str(outside)), reg("x/.wh.evil")],
        lambda outside: [sym("x", str(outside)), reg("x/.wh..wh..opq")],
        lambda outside: [sym("x", str(outside)), reg("f"), link("x/evil", "f")],
    ],
)
def test_writing_through_a_symlink_the_layer_planted_is_refused(
    tmp_path: Path, planted: Callable[[Path], list[Entry]]
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    entries = planted(outside)
    error = refused(tmp_path, tar(*entries), "writes through the symlink 'x'|writes through the symlink 'a/s'")
    assert error.message.startswith(f"layer entry {entries[-1][0].name.rstrip('/')!r}: ")
    assert list(outside.iterdir()) == []
    assert os.listxattr(outside) == []


@pytest.mark.parametrize("up", ["..", "../..", "../../..", "/", ".", "./.."])
def test_a_symlink_upwards_is_stored_but_never_written_through(tmp_path: Path, up: str) -> None:
    refused(tmp_path, tar(sym("up", up), reg("up/escape", b"evil")), "writes through the symlink 'up'")
    assert not (tmp_path / "escape").exists()
    target, _ = unpack(tmp_path, tar(sym("up", up)))
    assert os.readlink(target / "up") == up


def test_a_later_entry_replaces_an_earlier_one_without_following_it(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    blob = tar(
        sym("s", str(outside)),
        dir_("s/"),  # replaces the symlink: the directory is the layer's own
        reg("s/f", b"inside"),
        dir_("tree/"),
        reg("tree/a"),
        reg("tree", b"a file now"),
        reg("file", b"old"),
        reg("file", b"new"),
        dir_("meta/", mode=0o700),
        dir_("meta/", mode=0o750),
        reg("x", b"a file first"),
        sym("x", str(outside)),
    )
    target, _ = unpack(tmp_path, blob)
    assert (target / "s").is_dir() and not (target / "s").is_symlink()
    assert (target / "s/f").read_bytes() == b"inside"
    assert (target / "tree").read_bytes() == b"a file now"
    assert (target / "file").read_bytes() == b"new"
    assert stat.S_IMODE((target / "meta").stat().st_mode) == 0o750
    assert os.readlink(target / "x") == str(outside)
    assert list(outside.iterdir()) == []


def test_a_file_as_a_parent_is_refused(tmp_path: Path) -> None:
    refused(tmp_path, tar(reg("f"), reg("f/g")), "'f' is not a directory")


def test_bad_names_are_refused(tmp_path: Path) -> None:
    refused(tmp_path, tar(reg("a" * 200 + "/" + "b" * 200 + "/" + "c" * 4000)), "longer than 4096 bytes")
    refused(tmp_path, tar(reg("d/" * 300 + "f")), "more than 256 directories deep")
    refused(tmp_path, tar(reg("x", pax_headers={"path": "a\0b"})), "a name with a NUL byte")


def test_a_root_entry_that_is_not_a_directory_is_refused(tmp_path: Path) -> None:
    refused(tmp_path, tar(sym("./", "/etc")), "the layer's root is not a directory")


# -- broken streams and bounds -----------------------------------------------------------------


@pytest.mark.parametrize("cut", [0.5, 0.99, -8])
def test_a_truncated_gzip_stream_is_refused(tmp_path: Path, cut: float) -> None:
    packed = gzip.compress(tar(reg("f", os.urandom(300_000)), reg("g", b"\0" * 100_000)))
    end = int(len(packed) * cut) if cut > 0 else len(packed) + int(cut)
    refused(tmp_path, packed[:end], "truncated")


def test_a_truncated_or_garbled_tar_is_refused(tmp_path: Path) -> None:
    blob = tar(reg("f", b"x" * 512), reg("g", b"y" * 5000))
    refused(tmp_path, blob[:3000], "truncated or corrupt")  # inside g's data
    refused(tmp_path, blob[:1024], "ends without its end-of-archive marker")  # after f, before g's header
    refused(tmp_path, blob[:1300], "truncated or corrupt")  # inside g's header
    refused(tmp_path, os.urandom(4096), "truncated or corrupt")
    garbled = bytearray(blob)
    garbled[1024 + 10] ^= 0xFF  # g's header no longer matches its checksum
    refused(tmp_path, bytes(garbled), "truncated or corrupt")
    refused(tmp_path, b"\x28\xb5\x2f\xfd" + os.urandom(200), "truncated or corrupt")
    refused(tmp_path, b"\x1f\x8b" + os.urandom(200), "truncated or corrupt")


def test_the_byte_and_entry_bounds(tmp_path: Path) -> None:
    blob = tar(reg("a", b"x" * 600), reg("b", b"x" * 600), reg("c"), reg("d"))
    error = refused(tmp_path, blob, "max_bytes", max_bytes=1000)
    assert "'b'" in error.message and "raise max_bytes" in error.message
    refused(tmp_path, gzip.compress(blob), "max_entries", max_entries=3)
    _, stats = unpack(tmp_path, blob, max_bytes=1200, max_entries=4)
    assert (stats.entries, stats.bytes) == (4, 1200)


def test_a_decompression_bomb_stops_at_the_byte_bound(tmp_path: Path) -> None:
    zeros = zstandard.ZstdCompressor().compressobj()
    bomb = zeros.compress(tar(reg("big", b"\0" * (64 << 20)))) + zeros.flush()
    assert len(bomb) < 64 << 10
    refused(tmp_path, bomb, "max_bytes", max_bytes=1 << 20)
    trailer = zstandard.ZstdCompressor().compress(tar(reg("f")) + b"\0" * (8 << 20))
    refused(tmp_path, trailer, "max_bytes", max_bytes=1 << 20)


def test_a_huge_tar_header_is_refused(tmp_path: Path) -> None:
    refused(tmp_path, tar(reg("f", pax_headers={"comment": "x" * (3 << 20)})), "tar header")


class _FailingSource(io.BytesIO):
    """A blob whose reading fails halfway, as a disk or a connection may."""

    def read(self, size: int | None = -1, /) -> bytes:
        if self.tell() > 100_000:
            raise OSError(errno.EIO, "Input/output error")
        return super().read(min(size or 4096, 4096) if size and size > 0 else 4096)


def test_a_failing_host_is_said_to_be_the_hosts_fault_not_the_images(tmp_path: Path) -> None:
    blob = tar(reg("a", os.urandom(50_000)), reg("b", os.urandom(200_000)))
    target = tmp_path / "layer"
    with pytest.raises(LayerError, match=r"the host failed unpacking it \(\[Errno 5\] Input/output error\)"):
        unpack_layer(_FailingSource(gzip.compress(blob)), target, MINE)
    assert not target.exists()
    _no_worker_left()

    def full(uid: int) -> int:  # as if writing a's owner found the disk full
        if uid == 5:
            raise OSError(errno.ENOSPC, "No space left on device")
        return -1

    blob = tar(reg("a", b"x", uid=5))
    error = refused(tmp_path, blob, "No space left on device", LayerPolicy(full, _no_setid, lambda name: False))
    assert error.message.startswith("layer entry 'a': the host failed") and "hostile" not in error.message


def test_an_existing_target_is_the_callers_error_and_left_alone(tmp_path: Path) -> None:
    target = tmp_path / "layer"
    target.mkdir()
    (target / "mine").write_text("keep")
    with pytest.raises(FileExistsError):
        unpack_layer(io.BytesIO(tar(reg("f"))), target, MINE)
    assert (target / "mine").read_text() == "keep"
