"""A weight-update group through this host's shared memory: the ``shm`` backend, for engines on the trainer's host.

The CPU counterpart of what SGLang does for colocated engines with CUDA IPC handles
(``/update_weights_from_tensor``): rank 0 writes each bucket once into a file in ``/dev/shm`` and
every engine copies it out, instead of gloo sending the bytes over loopback TCP once per engine
(two copies per engine through the kernel's socket buffers, on the same cores as the engines). The
protocol is the group's (``/init_weights_update_group`` with ``backend = "shm"``, then
``/update_weights_from_distributed`` per bucket); only the order differs: rank 0 writes a bucket
*before* it posts the bucket's names, and writes the next one only after every engine answered, so
no engine reads a bucket being written (:attr:`SharedMemoryGroup.writes_first`).

The segment lives as long as the group: rank 0 creates it (``O_EXCL``, mode 0600) when it joins and
removes its name once every engine has opened it (:meth:`SharedMemoryGroup.all_joined`), so a trainer or
engine that dies leaves nothing behind in ``/dev/shm``. Its pages stay between pushes (a bucket's
first write page-faults once per 4 KiB; later pushes write into warm pages): the group holds the
biggest bucket's size (``[inference] weight_bucket_mb``, 256 MB) of shared memory while it lives, so
it is chosen only where ``/dev/shm`` has that room. An engine reads with
``pread`` into its own buffers, never maps the file: a segment shorter than the bucket declares is a
short read and a refusal, not a ``SIGBUS``; it opens the segment only if it is a regular file of its own
user (or root's) that no one else may write.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from sandrl.errors import ConfigError, InferenceError

SHM_DIR = Path("/dev/shm")
ALIGN = 64
"""Each tensor starts at a multiple of this many bytes in the segment."""


def segment_path(group_name: str) -> Path:
    """The segment of group ``group_name`` (a checked name: letters, digits, ``_.:-``, never a ``/``)."""
    return SHM_DIR / f"sandrl-weights-{group_name}"


def shm_room() -> int:
    """Bytes free in ``/dev/shm`` (0 where there is none): a container's is often 64 MiB, less than a bucket."""
    try:
        info = os.statvfs(SHM_DIR)
    except OSError:
        return 0
    return info.f_bavail * info.f_frsize


def layout(tensors: Sequence[torch.Tensor]) -> list[int]:
    """Each tensor's offset in the segment, in order; the last entry is the bytes the bucket needs."""
    offsets = [0]
    for tensor in tensors:
        end = offsets[-1] + tensor.numel() * tensor.element_size()
        offsets.append(-(-end // ALIGN) * ALIGN)
    return offsets


class SharedMemoryGroup:
    """One rank's membership of an ``shm`` group (a :class:`~sandrl.inference.weight_group.GroupMember`)."""

    writes_first = True
    device: torch.device | None = None

    def __init__(self, group_name: str, rank: int, fd: int) -> None:
        self.group_name = group_name
        self.rank = rank
        self._fd: int | None = fd
        self._named = rank == 0  # rank 0 removes the name once the engines have the file open

    @classmethod
    def join(cls, group_name: str, rank: int) -> SharedMemoryGroup:
        """Rank 0 creates the segment of group ``group_name`` (a checked name); every other rank opens it (rank 0
        must have joined first)."""
        path = segment_path(group_name)
        if rank == 0:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            except OSError as exc:
                raise InferenceError(f"could not create the weight segment {path}: {exc.strerror}") from exc
            return cls(group_name, rank, fd)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise ConfigError(
                f"could not open the weight segment {path} ({exc.strerror}): backend 'shm' is for engines that share "
                "the trainer's host and /dev/shm; use backend 'gloo' for the others",
                error_code="shm_unavailable",
            ) from exc
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid not in (os.geteuid(), 0) or info.st_mode & 0o022:
            os.close(fd)
            raise ConfigError(
                f"{path} is not a weight segment this engine trusts (a regular file of its own user or root's that no "
                "one else may write): remove it and push again",
                error_code="shm_unavailable",
            )
        return cls(group_name, rank, fd)

    def all_joined(self) -> None:
        """Every engine has the segment open: remove its name (the open files keep it while the group lives)."""
        if self._named:
            self._named = False
            with contextlib.suppress(FileNotFoundError):
                segment_path(self.group_name).unlink()

    def broadcast(self, tensors: Sequence[torch.Tensor]) -> None:
        """Rank 0: write ``tensors`` into the segment; the others: read them out of it, into ``tensors``."""
        fd = self._fd
        if fd is None:
            raise InferenceError(f"the weight group {self.group_name!r} is closed")
        offsets = layout(tensors)
        try:
            if self.rank == 0 and os.fstat(fd).st_size < offsets[-1]:
                os.ftruncate(fd, offsets[-1])
            for tensor, offset in zip(tensors, offsets, strict=False):
                if tensor.numel():
                    self._move(fd, _bytes(tensor), offset)
        except OSError as exc:
            raise InferenceError(f"the weight segment of group {self.group_name!r} failed: {exc}") from exc

    def _move(self, fd: int, view: memoryview, offset: int) -> None:
        done = 0
        while done < len(view):
            part = view[done:]
            moved = os.pwrite(fd, part, offset + done) if self.rank == 0 else os.preadv(fd, [part], offset + done)
            if moved <= 0:
                raise InferenceError(
                    f"the weight segment of group {self.group_name!r} holds fewer bytes than the bucket "
                    "declares: the trainer wrote another bucket than the one posted"
                )
            done += moved

    def close(self) -> None:
        self.all_joined()
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def _bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's memory as bytes, writable (received into in place): it must be contiguous on the CPU."""
    if not tensor.is_contiguous() or tensor.device.type != "cpu":
        raise InferenceError("a weight segment moves contiguous tensors in host memory only")
    array: Any = tensor.reshape(-1).view(torch.uint8).numpy()
    return memoryview(array).cast("B")
