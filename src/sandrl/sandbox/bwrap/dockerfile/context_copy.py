"""``COPY`` and ``ADD`` of build-context files: which files, their digest, and the tar archive of them.

The builder (:mod:`.builder`) unpacks the archive in the step's sandbox. Sources are matched in
the build context only (a pattern that leads outside it, or a URL, is refused), a local tar
archive is unpacked by ``ADD``, and ``--chown`` / ``--chmod`` set owners and modes in the archive.
The digest hashes what is copied (paths, types, modes, contents; not times), for the step's
cache key.

The context is the task's, and hostile like its Dockerfile: its files are read into this process to
be hashed and archived, so what a step copies is bounded by the build sandbox's disk (``limit``, its
``disk_mb``) before it is read: a sparse file of 100 TiB, or an ``ADD`` archive that unpacks to
more than the disk, is refused rather than read into the host's memory.
"""

from __future__ import annotations

import hashlib
import io
import os
import posixpath
import shlex
import stat
import tarfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from sandrl.images.dockerfile import Instruction, argument_words, expand
from sandrl.sandbox.base import Sandbox


class _Bound:
    """Bytes a step's copy may still read (see the module): an entry's as its tar archive holds it
    (a 512-byte header, the contents in 512-byte records), so the archive made in memory stays about within it."""

    def __init__(self, inst: Instruction, limit: int) -> None:
        self.inst, self.limit, self.used = inst, limit, 0

    def take(self, size: int) -> None:
        self.used += tarfile.BLOCKSIZE + -(-size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
        if self.used > self.limit:
            raise self.inst.error(
                f"the files it copies are more than the build's disk ({self.limit >> 20} MiB, its sandbox's disk_mb: "
                "a task's storage_mb): refused before reading them; copy less, or give the task more storage"
            )


def tar_of(
    inst: Instruction,
    matched: list[Path],
    dest_name: str,
    into_dir: bool,
    owner: tuple[int, int],
    mode: int | None,
    limit: int,
) -> bytes:
    """The files ``matched`` as one tar archive, laid out as ``COPY`` / ``ADD`` puts them at the
    destination: a directory's contents, an archive's members, a file under its own name when
    copied into a directory, else under ``dest_name``; their contents ``limit`` bytes at most."""
    archive = io.BytesIO()
    bound = _Bound(inst, limit)
    with tarfile.open(fileobj=archive, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in matched:
            if path.is_dir():
                _add_tree(tar, path, "", owner, mode, bound)
            elif is_archive(inst, path):
                _add_archive(tar, inst, path, owner, bound)
            elif into_dir:
                _add_one(tar, path, path.name, owner, mode, bound)
            else:
                _add_one(tar, path, dest_name, owner, mode, bound)
    return archive.getvalue()


def copy_args(inst: Instruction, env: Mapping[str, str]) -> tuple[list[str], str]:
    parts = argument_words(inst, env)
    if len(parts) < 2:
        raise inst.error("needs at least one source and a destination")
    for source in parts[:-1]:
        if "://" in source or source.startswith("git@"):
            raise inst.error(
                f"{source!r} is a URL; sandrl's builder copies build-context files only (no network at build "
                "time): download the file into the task's environment/ directory and COPY it"
            )
    return parts[:-1], parts[-1]


def has_glob(pattern: str) -> bool:
    return any(ch in pattern for ch in "*?[")


def match(inst: Instruction, context: Path, pattern: str) -> list[Path]:
    rel = posixpath.normpath(pattern.lstrip("/")) if pattern.strip("/") else "."
    if rel == ".." or rel.startswith("../"):
        raise inst.error(f"{pattern!r} is outside the build context {context}")
    found = sorted(context.glob(rel)) if has_glob(rel) else [context / rel]
    found = [p for p in found if p.exists() or p.is_symlink()]
    if not found:
        raise inst.error(f"{pattern!r} is not in the build context {context}")
    for path in found:
        if not path.resolve().is_relative_to(context) and not path.is_symlink():
            raise inst.error(f"{pattern!r} leads outside the build context {context}")
    return found


def is_archive(inst: Instruction, path: Path) -> bool:
    return inst.keyword == "ADD" and path.is_file() and tarfile.is_tarfile(path)


def _walk(root: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        base = Path(dirpath)
        for name in [*dirnames, *sorted(filenames)]:
            yield base / name


def sources_digest(inst: Instruction, context: Path, env: Mapping[str, str], limit: int) -> str:
    """A hash of every file a COPY/ADD copies: paths, types, modes, contents (not times); their
    contents ``limit`` bytes at most."""
    sources, _ = copy_args(inst, env)
    digest = hashlib.sha256()
    bound = _Bound(inst, limit)
    for pattern in sources:
        for path in match(inst, context, pattern):
            for item in [path, *(_walk(path) if path.is_dir() and not path.is_symlink() else [])]:
                st = item.lstat()
                bound.take(st.st_size if stat.S_ISREG(st.st_mode) else 0)
                digest.update(f"{item.relative_to(context)}\0{st.st_mode:o}\0".encode())
                if stat.S_ISLNK(st.st_mode):
                    digest.update(os.readlink(item).encode())
                elif stat.S_ISREG(st.st_mode):
                    with open(item, "rb") as f:
                        for chunk in iter(lambda: f.read(1 << 20), b""):
                            digest.update(chunk)
                digest.update(b"\1")
    return digest.hexdigest()


def mode_of(inst: Instruction, env: Mapping[str, str]) -> int | None:
    value = inst.flags.get("chmod")
    if value is None:
        return None
    try:
        mode = int(expand(value, env, inst.where), 8)
    except ValueError:
        raise inst.error(f"--chmod={value} is not an octal mode (e.g. --chmod=755)") from None
    if not 0 <= mode <= 0o7777:
        raise inst.error(f"--chmod={value} is not a file mode")
    return mode


async def owner_of(inst: Instruction, sandbox: Sandbox, env: Mapping[str, str]) -> tuple[int, int]:
    value = inst.flags.get("chown")
    if value is None:
        return 0, 0
    user, _, group = expand(value, env, inst.where).partition(":")
    ids: list[int] = []
    for name, flag in ((user, "-u"), (group or user, "-g")):
        if name.isdigit():
            ids.append(int(name))
            continue
        lookup = (
            f"id {flag} {shlex.quote(name)}"
            if flag == "-u" or not group
            else f"getent group {shlex.quote(name)} | cut -d: -f3"
        )
        result = await sandbox.exec(lookup, timeout_s=30, cwd="/")
        if result.exit_code != 0 or not result.stdout.strip().isdigit():
            raise inst.error(f"--chown={value}: no user or group {name!r} in the image")
        ids.append(int(result.stdout.strip()))
    return ids[0], ids[1]


def _tar_info(
    tar: tarfile.TarFile, path: Path, arcname: str, owner: tuple[int, int], mode: int | None
) -> tarfile.TarInfo:
    info = tar.gettarinfo(str(path), arcname=arcname)
    info.uid, info.gid = owner
    info.uname = info.gname = ""
    if mode is not None and not info.issym():
        info.mode = mode
    return info


def _add_one(
    tar: tarfile.TarFile, path: Path, arcname: str, owner: tuple[int, int], mode: int | None, bound: _Bound
) -> None:
    info = _tar_info(tar, path, arcname, owner, mode)
    bound.take(info.size if info.isreg() else 0)
    if info.isreg():
        with open(path, "rb") as f:
            tar.addfile(info, f)
    else:
        tar.addfile(info)


def _add_tree(
    tar: tarfile.TarFile, root: Path, prefix: str, owner: tuple[int, int], mode: int | None, bound: _Bound
) -> None:
    """The contents of ``root`` (not itself), as Docker's COPY of a directory."""
    for item in _walk(root):
        _add_one(tar, item, posixpath.join(prefix, item.relative_to(root).as_posix()), owner, mode, bound)


def _add_archive(tar: tarfile.TarFile, inst: Instruction, path: Path, owner: tuple[int, int], bound: _Bound) -> None:
    """ADD of a local tar archive: its members, unpacked (any compression tarfile reads)."""
    chown = "chown" in inst.flags
    with tarfile.open(path, mode="r:*") as archive:
        for member in archive:
            name = posixpath.normpath(member.name.lstrip("/"))
            if name == ".." or name.startswith("../"):
                raise inst.error(f"the archive {path.name} holds {member.name!r}, outside its directory")
            if member.isdev():
                continue
            member.name = name
            if chown:
                member.uid, member.gid = owner
                member.uname = member.gname = ""
            bound.take(member.size if member.isreg() else 0)  # as its header says: no more is read
            data = archive.extractfile(member) if member.isreg() else None
            tar.addfile(member, data)
