"""A sandbox's changes as an image layer: what ``docker commit`` does, for the bubblewrap backend.

Every overlay of a :class:`~sandrl.sandbox.bwrap.BwrapSandbox` keeps what the sandbox wrote in its
upper directory, ``/tmp/sandrl/upper/<k>`` in the sandbox helper's private mount namespace (the
k-th overlay of the sandbox's mount plan, ``/`` first). :func:`export_changes` copies each one
into ``dest/<mount point>`` on the host, so that ``dest`` is a layer tree in overlayfs' own
format, ready to be stacked as a read-only lower layer over the layers the sandbox started from:

- files, directories, symlinks and hard links keep their modes and times;
- deleted entries stay overlayfs *whiteouts* (character devices 0:0) and replaced directories
  stay *opaque* (the xattr ``trusted.overlay.opaque=y``), so they hide what is below them;
- owners are shifted into the image store's own mapping: the sandbox's uid ``n`` is host uid
  ``sandbox.uid + n`` in the upper directory and ``STORE_UID_BASE + n`` in the layer, which
  sandboxes mount idmapped back to ``n`` (:mod:`sandrl.sandbox.bwrap.layer_owners`), so nothing a
  sandbox made is host root's on the host;
- setuid and setgid bits are dropped from files (sandboxes run with ``NO_NEW_PRIVS``: they never
  worked inside; on the host they would be a way to root), and device nodes other than whiteouts
  are left out;
- overlayfs' bookkeeping xattrs (``origin``, ``impure``...) are dropped: they describe the
  sandbox's own mount, not the layer.

The copy is one tar stream from ``nsenter --mount tar -c`` in the helper's namespace, re-owned on
the way by :mod:`tarfile`, into ``tar -x`` on the host. The sandbox keeps running; export while
no command is writing, or the layer holds whatever state the files were in.
"""

from __future__ import annotations

import asyncio
import os
import posixpath
import shutil
import stat
import subprocess
import tarfile
from pathlib import Path
from typing import IO

from sandrl.errors import SandboxError
from sandrl.sandbox.bwrap.layer_owners import KEPT_XATTRS, NOBODY, layer_mode, store_id
from sandrl.sandbox.bwrap.sandbox import UPPER_DIR, BwrapSandbox
from sandrl.sandbox.bwrap.state import UID_RANGE

EXPORT_TIMEOUT_S = 600.0
_EXCLUDED_TOP = {".bubblewrap"}
"""Top-level names in the root upper dir that are bubblewrap's scratch, never the sandbox's work."""
_OWNER_KEYS = {"uid", "gid", "uname", "gname"}


def _tar_flags() -> list[str]:
    return ["--numeric-owner", "--xattrs", *(f"--xattrs-include={pattern}" for pattern in KEPT_XATTRS)]


def _shift(value: int, base: int) -> int:
    """A host uid (or gid) of the upper dir → its owner in the store's mapping.

    Host root owns what overlayfs made itself (whiteouts): sandbox root's in the layer.
    """
    if base <= value < base + UID_RANGE:
        return store_id(value - base)
    return store_id(0 if value == 0 else NOBODY)


def _excluded(name: str, is_root_overlay: bool, target: str = "/", skip: frozenset[str] = frozenset()) -> bool:
    parts = posixpath.normpath(name).split("/")
    parts = [p for p in parts if p not in ("", ".")]
    if not parts:
        return False
    if posixpath.join(target, *parts) in skip:
        return True
    if not is_root_overlay:
        return False
    return parts[0] in _EXCLUDED_TOP or parts[0].startswith(".bubblewrap-")


def _reown(
    source: IO[bytes],
    sink: IO[bytes],
    base: int,
    is_root_overlay: bool,
    target: str = "/",
    skip: frozenset[str] = frozenset(),
) -> int:
    """Copy a tar stream, shifting owners by ``-base``; return the number of members written."""
    count = 0
    with (
        tarfile.open(fileobj=source, mode="r|") as reader,
        tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as writer,
    ):
        for member in reader:
            if _excluded(member.name, is_root_overlay, target, skip):
                continue
            if member.isblk() or (member.ischr() and (member.devmajor, member.devminor) != (0, 0)):
                continue  # a sandbox cannot make real devices; layers are nodev anyway
            member.uid = _shift(member.uid, base)
            member.gid = _shift(member.gid, base)
            if not member.isdir():
                member.mode = stat.S_IMODE(layer_mode(stat.S_IFREG | member.mode))
            member.uname = member.gname = ""
            # Large host uids travel in pax headers, which would win over the fields above.
            member.pax_headers = {k: v for k, v in member.pax_headers.items() if k not in _OWNER_KEYS}
            data = reader.extractfile(member) if member.isreg() else None
            writer.addfile(member, data)
            count += 1
    return count


def _export_overlay(
    host_pid: int, base: int, k: int, target_dir: Path, is_root_overlay: bool, target: str, skip: frozenset[str]
) -> int:
    """Copy one upper dir into ``target_dir``; return how many entries it held (its root included)."""
    target_dir.mkdir(parents=True, exist_ok=True)
    create = [
        "nsenter",
        f"--target={host_pid}",
        "--mount",
        "--",
        "tar",
        "-C",
        f"{UPPER_DIR}/{k}",
        *_tar_flags(),
        "--format=posix",
        "-cf",
        "-",
        ".",
    ]
    extract = ["tar", "-C", str(target_dir), *_tar_flags(), "--same-owner", "--same-permissions", "-xf", "-"]
    producer = subprocess.Popen(create, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    consumer = subprocess.Popen(extract, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    source, sink = producer.stdout, consumer.stdin
    assert source is not None and sink is not None
    producer.stdout = consumer.stdin = None  # ours to close; communicate() below reads stderr only
    count = 0
    failure: BaseException | None = None
    try:
        count = _reown(source, sink, base, is_root_overlay, target, skip)
        while source.read(1 << 16):  # tar pads its stream past the end marker tarfile stops at
            pass
    except (tarfile.TarError, OSError) as exc:
        failure = exc
    finally:
        source.close()
        try:
            sink.close()
        except OSError as exc:  # the consumer died early: its stderr says why
            failure = failure or exc
    _, create_err = producer.communicate(timeout=EXPORT_TIMEOUT_S)
    _, extract_err = consumer.communicate(timeout=EXPORT_TIMEOUT_S)
    if producer.returncode != 0 or consumer.returncode != 0 or failure is not None:
        detail = (create_err + extract_err).decode(errors="replace").strip()[-800:] or str(failure)
        raise SandboxError(
            f"exporting the writable layer {k} of sandbox (helper pid {host_pid}) failed "
            f"(tar exit {producer.returncode}/{consumer.returncode}): {detail}"
        )
    return count


def _export_sync(host_pid: int, base: int, overlays: list[str], dest: Path, skip: frozenset[str]) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    # "/" first, so a nested mount point's directory exists before its own tree goes in.
    for k, target in sorted(enumerate(overlays), key=lambda item: item[1].count("/") if item[1] != "/" else -1):
        rel = target.strip("/")
        target_dir = dest / rel if rel else dest
        if rel:
            # The root overlay never holds anything at a mount point; clear what is there to be safe.
            if target_dir.is_symlink() or (target_dir.exists() and not target_dir.is_dir()):
                target_dir.unlink()
            staging = dest.parent / f".{dest.name}.{k}.part"
            shutil.rmtree(staging, ignore_errors=True)
            count = _export_overlay(host_pid, base, k, staging, False, target, skip)
            if count <= 1:  # only the upper dir itself: nothing changed under this mount point
                shutil.rmtree(staging)
                continue
            if target_dir.is_dir():
                shutil.rmtree(target_dir)
            _store_owned_dirs(dest, target_dir.parent)
            os.rename(staging, target_dir)
        else:
            _export_overlay(host_pid, base, k, target_dir, True, target, skip)


def _store_owned_dirs(dest: Path, path: Path) -> None:
    """Make ``path`` and its missing parents below ``dest`` as a layer's directories: sandbox root's, 0755."""
    missing = []
    while path != dest and not path.exists():
        missing.append(path)
        path = path.parent
    for d in reversed(missing):
        d.mkdir(mode=0o755)
        os.chown(d, store_id(0), store_id(0))
        os.chmod(d, 0o755)


async def export_changes(sandbox: BwrapSandbox, dest: Path, *, skip: frozenset[str] = frozenset()) -> None:
    """Copy what ``sandbox`` changed into ``dest`` as a layer tree (``dest/<mount point>`` per overlay).

    ``skip``: absolute paths in the sandbox left out of the layer (a build's ``/etc/resolv.conf``,
    which Docker's builds do not commit either).

    ``dest`` is made if missing; it should be on the filesystem of the image store so that the
    store can take it over with a rename. Needs root (``nsenter``) and GNU tar on the host.
    """
    if sandbox.closed:
        raise SandboxError(f"sandbox {sandbox.id} is closed; export its changes before closing it")
    plan = sandbox.mount_plan
    if plan is None or sandbox.uid == 0:
        raise SandboxError(f"sandbox {sandbox.id} has no mount plan or uid; it was not made by BwrapProvider")
    overlays = [target for target, _ in plan.overlays]
    await asyncio.to_thread(_export_sync, sandbox.host_pid, sandbox.uid, overlays, Path(dest), skip)


def is_empty_layer(layer: Path) -> bool:
    """True when an exported layer holds no change at all (only its own root directory)."""
    return not any(layer.iterdir())
