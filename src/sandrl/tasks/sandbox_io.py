"""Files in and out of a sandbox, and commands whose output is kept in a file, over the Sandbox protocol.

Only ``exec``, ``write_file`` and ``read_file`` are used, so this works with every backend. A
directory travels as one tar stream on the stdin of ``tar -x`` inside the sandbox: one round trip
whatever the number of files, and modes (the executable bit of ``test.sh``) are kept. Members are
stored as root-owned so that the host's uids do not leak in.
"""

from __future__ import annotations

import errno
import io
import posixpath
import shlex
import tarfile
from collections.abc import Mapping
from pathlib import Path

from sandrl.errors import SandboxFileError
from sandrl.sandbox.base import ExecResult, Sandbox
from sandrl.sandbox.command import Command

UPLOAD_TIMEOUT_S = 300.0
LOG_TAIL_BYTES = 256 * 1024
"""How much of the end of a logged command's output is read back."""


def _as_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def tar_path(source: Path, arcname: str = ".") -> bytes:
    """A tar archive of a file or a directory tree (symlinks kept as links)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        archive.add(str(source), arcname=arcname, recursive=True, filter=_as_root)
    return buffer.getvalue()


def empty_dir_command(path: str) -> str:
    """Shell that leaves ``path`` an existing, empty directory.

    It empties rather than removes, because the directory may be a mount point (Harbor mounts
    /logs/verifier), which cannot be removed.
    """
    quoted = shlex.quote(path)
    return f"mkdir -p {quoted} && find {quoted} -mindepth 1 -maxdepth 1 -exec rm -rf {{}} +"


async def extract_tar(
    sandbox: Sandbox, data: bytes, dest: str, *, replace: bool, timeout_s: float = UPLOAD_TIMEOUT_S
) -> None:
    """Unpack a tar archive at ``dest`` in the sandbox; with ``replace``, whatever was there goes first."""
    quoted = shlex.quote(dest)
    command = empty_dir_command(dest) if replace else f"mkdir -p {quoted}"
    result = await sandbox.exec(f"{command} && tar -xf - -C {quoted}", stdin=data, timeout_s=timeout_s, cwd="/")
    if result.exit_code != 0:
        raise SandboxFileError(
            f"copying files to {dest} in sandbox {sandbox.id} failed (exit {result.exit_code}): "
            f"{(result.stderr or result.stdout).strip()[-500:]}; the sandbox needs tar and a writable {dest}"
        )


async def upload(sandbox: Sandbox, source: Path, dest: str) -> None:
    """Copy a host directory to ``dest`` (replacing it), or a host file to the path ``dest``."""
    if not dest.startswith("/"):
        raise SandboxFileError(f"upload destination must be an absolute path, got {dest!r}")
    if source.is_dir():
        # Replaced, not merged: files the agent left at a tests path must not survive into verification.
        await extract_tar(sandbox, tar_path(source), dest, replace=True)
    elif source.is_file():
        parent, name = posixpath.split(dest.rstrip("/"))
        await extract_tar(sandbox, tar_path(source, arcname=name), parent or "/", replace=False)
    else:
        raise SandboxFileError(f"cannot copy {source} into the sandbox: it does not exist")


async def upload_all(sandbox: Sandbox, uploads: Mapping[str, Path]) -> None:
    """Every ``sandbox path → host path`` entry, in order (a directory first, then files into it)."""
    for dest, source in uploads.items():
        await upload(sandbox, source, dest)


async def run(sandbox: Sandbox, command: Command, *, what: str, timeout_s: float = 60.0, cwd: str = "/") -> ExecResult:
    """A housekeeping command that must succeed (mkdir, rm); its failure is the machinery's. An argv where
    it is one program (no shell starts: :mod:`sandrl.sandbox.command`)."""
    result = await sandbox.exec(command, timeout_s=timeout_s, cwd=cwd)
    if result.exit_code != 0:
        raise SandboxFileError(
            f"{what} failed in sandbox {sandbox.id} (exit {result.exit_code}): "
            f"{(result.stderr or result.stdout).strip()[-500:]}"
        )
    return result


async def run_logged(
    sandbox: Sandbox,
    command: str,
    *,
    log: str,
    timeout_s: float,
    cwd: str,
    env: Mapping[str, str] | None = None,
) -> tuple[ExecResult, str]:
    """Run ``command`` with stdout and stderr interleaved into the file ``log``; return its result and the log's end.

    The output goes to a file, not through the exec result, because that result is capped from
    the start while a test run's verdict (pytest's summary) is at the end.
    """
    quoted = shlex.quote(log)
    result = await sandbox.exec(f"{{\n{command}\n}} > {quoted} 2>&1", timeout_s=timeout_s, cwd=cwd, env=env)
    shown = await sandbox.exec(["tail", "-c", str(LOG_TAIL_BYTES), "--", log], timeout_s=60.0, cwd="/")
    return result, shown.stdout if shown.exit_code == 0 else ""


def is_missing(exc: SandboxFileError) -> bool:
    """The file does not exist (as opposed to one that is there but cannot be read)."""
    return exc.errno == errno.ENOENT or exc.error_code == "file_not_found"


async def read_optional(sandbox: Sandbox, path: str, *, max_bytes: int) -> bytes | None:
    """The file's bytes, at most ``max_bytes`` of them, or None when it does not exist.

    Any other failure is raised (:class:`~sandrl.errors.SandboxFileError`): a file that is there but
    cannot be read within the bound (larger, a FIFO or a device, a directory) was made so by something
    in the sandbox, and the caller decides what that means.
    """
    try:
        return await sandbox.read_file(path, max_bytes=max_bytes)
    except SandboxFileError as exc:
        if is_missing(exc):
            return None
        raise
