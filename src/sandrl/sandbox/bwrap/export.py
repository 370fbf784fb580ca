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

The copy reads the upper directories through ``/proc/<helper pid>/root`` and writes the layer
tree directly (:mod:`.upper_copy`: no symlink followed, contents by ``sendfile``, holes kept as
holes, owners shifted on the way), within the layer's bounds (:mod:`.layer_budget`: the sandbox's
``disk_mb`` as the store counts it, the store's free space less its reserve): over one, it raises
:class:`~sandrl.errors.LayerTooLargeError` and leaves nothing in ``dest``'s directory but ``dest``
itself, for its caller to remove. The sandbox keeps running; export while no command is writing (a snapshot freezes
it first), or the layer holds whatever state the files were in.
"""

from __future__ import annotations

import asyncio
import errno
import os
import posixpath
import shutil
from pathlib import Path

from sandrl.errors import SandboxError
from sandrl.sandbox.bwrap.layer_budget import LayerBudget, StoreReserve
from sandrl.sandbox.bwrap.layer_owners import store_id
from sandrl.sandbox.bwrap.sandbox import UPPER_DIR, BwrapSandbox
from sandrl.sandbox.bwrap.upper_copy import copy_upper

_EXCLUDED_TOP = {".bubblewrap"}
"""Top-level names in the root upper dir that are bubblewrap's scratch, never the sandbox's work."""


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


def _export_overlay(
    host_pid: int,
    base: int,
    k: int,
    target_dir: Path,
    is_root_overlay: bool,
    target: str,
    skip: frozenset[str],
    budget: LayerBudget,
) -> int:
    """Copy one upper dir into ``target_dir``; return how many entries it held (its root included)."""
    source = f"/proc/{host_pid}/root{UPPER_DIR}/{k}"
    try:
        return copy_upper(
            source, str(target_dir), base, lambda name: _excluded(name, is_root_overlay, target, skip), budget, target
        )
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):  # the store filled up under other writers' files
            raise budget.no_room() from exc
        raise SandboxError(
            f"exporting the writable layer {k} of sandbox (helper pid {host_pid}) failed: {exc}; "
            "the sandbox may have ended meanwhile"
        ) from exc


def _export_sync(
    host_pid: int, base: int, overlays: list[str], dest: Path, skip: frozenset[str], budget: LayerBudget
) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    try:
        _export_overlays(host_pid, base, overlays, dest, skip, budget)
    except BaseException:
        # Over a bound, cancelled, failed: what was written goes now, in this thread, which is the
        # one writing (a cancelled caller's own removal could run before the copy has stopped).
        for entry in os.scandir(dest):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                os.unlink(entry.path)
        raise


def _export_overlays(
    host_pid: int, base: int, overlays: list[str], dest: Path, skip: frozenset[str], budget: LayerBudget
) -> None:
    # "/" first, so a nested mount point's directory exists before its own tree goes in.
    for k, target in sorted(enumerate(overlays), key=lambda item: item[1].count("/") if item[1] != "/" else -1):
        rel = target.strip("/")
        target_dir = dest / rel if rel else dest
        if rel:
            # The root overlay never holds anything at a mount point; clear what is there to be safe.
            if target_dir.is_symlink() or (target_dir.exists() and not target_dir.is_dir()):
                target_dir.unlink()
            if _empty_upper(host_pid, k):
                continue  # nothing changed under this mount point: no staging directory to make and remove
            staging = dest.parent / f".{dest.name}.{k}.part"
            shutil.rmtree(staging, ignore_errors=True)
            try:
                count = _export_overlay(host_pid, base, k, staging, False, target, skip, budget)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            if count <= 1:  # only the upper dir itself: nothing changed under this mount point
                shutil.rmtree(staging)
                continue
            if target_dir.is_dir():
                shutil.rmtree(target_dir)
            _store_owned_dirs(dest, target_dir.parent)
            os.rename(staging, target_dir)
        else:
            _export_overlay(host_pid, base, k, target_dir, True, target, skip, budget)


def _empty_upper(host_pid: int, k: int) -> bool:
    """The k-th upper dir holds no entry (the sandbox wrote nothing under that mount point): what a
    copy of it would find (:func:`_export_overlays` drops a copy that holds only its root)."""
    try:
        with os.scandir(f"/proc/{host_pid}/root{UPPER_DIR}/{k}") as entries:
            return next(entries, None) is None
    except OSError:
        return False  # the copy reports it, with its context


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


async def export_changes(
    sandbox: BwrapSandbox,
    dest: Path,
    *,
    skip: frozenset[str] = frozenset(),
    reserve: StoreReserve | None = None,
    hint: str = "remove what need not be kept before the snapshot, or create the sandbox with a larger disk_mb",
) -> None:
    """Copy what ``sandbox`` changed into ``dest`` as a layer tree (``dest/<mount point>`` per overlay).

    ``skip``: absolute paths in the sandbox left out of the layer (a build's ``/etc/resolv.conf``,
    which Docker's builds do not commit either). ``reserve``: what the filesystem of ``dest`` keeps
    free (the store's; default :meth:`StoreReserve.from_env`). ``hint``: what the error of a layer
    over the sandbox's ``disk_mb`` tells its reader to do.

    ``dest`` is made if missing; it should be on the filesystem of the image store so that the
    store can take it over with a rename. Needs root (it reads the sandbox through ``/proc``).
    Raises :class:`~sandrl.errors.LayerTooLargeError` when the layer is over a bound (see the module).
    """
    if sandbox.closed:
        raise SandboxError(f"sandbox {sandbox.id} is closed; export its changes before closing it")
    plan = sandbox.mount_plan
    if plan is None or sandbox.uid == 0:
        raise SandboxError(f"sandbox {sandbox.id} has no mount plan or uid; it was not made by BwrapProvider")
    overlays = [target for target, _ in plan.overlays]
    dest = Path(dest)
    budget = LayerBudget(
        _existing(dest),
        reserve or StoreReserve.from_env(),
        disk_mb=sandbox.spec.disk_mb,
        owner=f"sandbox {sandbox.id}'s changes",
        hint=hint,
    )
    try:  # the sandbox's writable tmpfs: what it holds tells a layer that cannot fit before any copy
        disk = os.statvfs(f"/proc/{sandbox.host_pid}/root{UPPER_DIR}")
    except OSError as exc:
        raise SandboxError(f"sandbox {sandbox.id}'s writable layer cannot be read ({exc}); it may have ended") from exc
    budget.expect((disk.f_blocks - disk.f_bfree) * disk.f_frsize, disk.f_files - disk.f_ffree)
    try:
        await asyncio.to_thread(_export_sync, sandbox.host_pid, sandbox.uid, overlays, dest, skip, budget)
    except asyncio.CancelledError:
        budget.stop()  # the copy goes on in its thread otherwise; it stops at its next write and cleans up
        raise


def _existing(path: Path) -> Path:
    """``path`` or its nearest existing parent: where its filesystem's free space is read."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def is_empty_layer(layer: Path) -> bool:
    """True when an exported layer holds no change at all (only its own root directory)."""
    return not any(layer.iterdir())
