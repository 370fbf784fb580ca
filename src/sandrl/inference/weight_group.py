"""The process group that carries new weights from the trainer to the engines, without the disk.

SGLang's protocol (``/init_weights_update_group``, ``/update_weights_from_distributed``,
``/destroy_weights_update_group``), which Miles, slime and verl drive: the trainer's first rank is
rank 0 of a group of its own, each engine's GPUs the ranks after it (``rank_offset``); the trainer
broadcasts each tensor of a bucket from rank 0 while every engine, told the bucket's names, dtypes
and shapes over HTTP, receives it into buffers of those shapes. NCCL between GPUs, gloo on CPU, and
sandrl's ``shm`` for its embedded engines on the trainer's host
(:mod:`~sandrl.inference.weight_shm`: the bucket written once into shared memory, not sent per engine).

The group is not ``torch.distributed``'s default group (the trainer's ranks have that one): it is
a process group object of its own, over a TCP store that rank 0 hosts (``master_address``,
``master_port``) and every other rank joins, its keys under the group's name. On a loopback master
every rank's gloo pairs bind loopback too, so a group on one host never leaves it.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch.distributed import PrefixStore, TCPStore  # type: ignore[attr-defined]

from sandrl.errors import ConfigError, InferenceError
from sandrl.http_auth import is_loopback
from sandrl.inference.weight_shm import SharedMemoryGroup

BACKENDS = ("gloo", "nccl", "shm")
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}
"""The dtypes a bucket may carry, by the names SGLang's clients send (``torch.bfloat16`` is accepted too)."""
_GROUP_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


def dtype_name(dtype: torch.dtype) -> str:
    """The wire name of ``dtype`` (``torch.bfloat16`` -> ``bfloat16``)."""
    return str(dtype).removeprefix("torch.")


def parse_dtype(name: object, tensor: str) -> torch.dtype:
    """The dtype a bucket names for ``tensor``; a ConfigError naming the tensor for any other."""
    key = str(name).removeprefix("torch.")
    if key not in DTYPES:
        raise ConfigError(
            f"tensor {tensor!r}: dtype {name!r} is not a weight dtype; send one of {', '.join(DTYPES)}",
            error_code="bad_weight_dtype",
        )
    return DTYPES[key]


@dataclass(frozen=True)
class GroupAddress:
    """Where a weight-update group meets and how big it is (the body of ``/init_weights_update_group``)."""

    master_address: str
    master_port: int
    world_size: int
    group_name: str
    backend: str = "gloo"

    def __post_init__(self) -> None:
        if not isinstance(self.master_port, int) or not 0 < self.master_port < 65536:
            raise ConfigError(f"master_port must be a TCP port (1-65535), got {self.master_port!r}")
        if not isinstance(self.world_size, int) or self.world_size < 2:
            raise ConfigError(f"world_size must be at least 2 (the trainer and one engine), got {self.world_size!r}")
        if not isinstance(self.group_name, str) or not _GROUP_NAME.match(self.group_name):
            raise ConfigError(
                f"group_name must be 1-128 letters, digits, '_', '.', ':' or '-', got {self.group_name!r}"
            )
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.backend == "nccl" and not torch.cuda.is_available():
            raise ConfigError("backend 'nccl' needs a GPU on this side; use backend 'gloo' on CPU")
        if self.backend == "shm" and not self.loopback:
            raise ConfigError(
                "backend 'shm' passes weights through this host's shared memory: its master_address must be "
                f"loopback (engines on the trainer's host), got {self.master_address!r}; use 'gloo' across hosts"
            )

    @property
    def loopback(self) -> bool:
        return is_loopback(self.master_address)


class GroupMember(Protocol):
    """One rank's membership of a weight-update group, whatever carries the bytes (:func:`join_group`)."""

    rank: int
    device: torch.device | None
    writes_first: bool
    """Rank 0 sends a bucket before the engines are asked to take it (shared memory), not as they are (a
    collective, which both sides enter at once)."""

    def broadcast(self, tensors: Sequence[torch.Tensor]) -> None: ...

    def all_joined(self) -> None:
        """Every rank has joined (rank 0 learns it from the engines' answers)."""
        ...

    def close(self) -> None: ...


def join_group(address: GroupAddress, rank: int, *, timeout_s: float = 300.0) -> GroupMember:
    """Join ``address``'s group as ``rank``; blocking for a process group (until every rank has joined)."""
    if address.backend == "shm":
        return SharedMemoryGroup.join(address.group_name, rank)
    return WeightGroup.join(address, rank, timeout_s=timeout_s)


class WeightGroup:
    """One rank's membership of a weight-update group; :meth:`join` blocks until every rank has joined."""

    writes_first = False

    def __init__(self, address: GroupAddress, rank: int, group: Any, store: Any) -> None:
        self.address = address
        self.rank = rank
        self._group = group
        self._store = store  # rank 0 hosts the store: it lives as long as the group
        self.device = torch.device("cuda", torch.cuda.current_device()) if address.backend == "nccl" else None

    @classmethod
    def join(cls, address: GroupAddress, rank: int, *, timeout_s: float = 300.0) -> WeightGroup:
        """Join as ``rank`` (0: the trainer, which hosts the store); blocking, so call it from a worker thread."""
        if not isinstance(rank, int) or not 0 <= rank < address.world_size:
            raise ConfigError(f"rank_offset must be in 0..{address.world_size - 1}, got {rank!r}")
        timeout = timedelta(seconds=timeout_s)
        try:
            store = TCPStore(
                address.master_address,
                address.master_port,
                address.world_size,
                rank == 0,
                timeout,
                wait_for_workers=False,
            )
            prefixed = PrefixStore(f"sandrl-weights/{address.group_name}/", store)
            if address.backend == "nccl":
                group: Any = dist.ProcessGroupNCCL(prefixed, rank, address.world_size)  # type: ignore[call-arg]
            else:
                options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
                options._timeout = timeout
                host = "127.0.0.1" if address.loopback else None
                device = (
                    dist.ProcessGroupGloo.create_device(hostname=host)
                    if host is not None
                    else dist.ProcessGroupGloo.create_default_device()
                )
                options._devices = [device]
                group = dist.ProcessGroupGloo(prefixed, rank, address.world_size, options)
        except (RuntimeError, OSError, dist.DistBackendError) as exc:
            raise InferenceError(
                f"could not join the weight-update group {address.group_name!r} at "
                f"{address.master_address}:{address.master_port} as rank {rank} of {address.world_size}: {exc}"
            ) from exc
        return cls(address, rank, group, store)

    def broadcast(self, tensors: Sequence[torch.Tensor]) -> None:
        """Broadcast ``tensors`` from rank 0 (the others receive into them), all in flight at once."""
        options = dist.BroadcastOptions()
        options.rootRank = 0
        try:
            works = [self._group.broadcast([t], options) for t in tensors]
            for work in works:
                work.wait()
        except (RuntimeError, dist.DistBackendError) as exc:
            raise InferenceError(
                f"the weight broadcast of group {self.address.group_name!r} failed (a rank left?): {exc}"
            ) from exc

    def all_joined(self) -> None:
        """Nothing to do: a process group is whole once :meth:`join` returned."""

    def close(self) -> None:
        shutdown = getattr(self._group, "shutdown", None)
        if callable(shutdown):
            with contextlib.suppress(RuntimeError):  # already broken: nothing to let go of
                shutdown()
        self._group = None
        self._store = None
