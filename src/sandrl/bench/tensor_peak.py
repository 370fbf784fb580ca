"""Peak memory of a computation, counted tensor by tensor, and a process's resident memory.

:class:`TensorPeak` adds up the storage of every tensor an operator makes while it is active, and
takes each one off when its storage is freed (autograd's saved tensors stay counted while the graph
holds them): the peak is what an allocator would have to hold at once for the tensors the
computation made, inputs aside. It counts ``meta`` tensors as it counts real ones, so a
computation too large for this machine (the full ``[8192, 152064]`` logits and their gradients:
14 GiB) is measured without being run; a test checks that both give the same peak.

:func:`rss_bytes` and :func:`reset_peak_rss` read and reset a process's resident set and its
high-water mark (``VmHWM``) in ``/proc``: writing 5 to ``clear_refs`` sets the mark to the current
RSS (Linux >= 4.0), so the peak of one training step can be read from outside the process.
"""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class TensorPeak(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """``with TensorPeak() as peak: ...``, then ``peak.peak``: the most bytes alive at once."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.live = 0
        """Bytes of the storages made in the block and not yet freed."""
        self.peak = 0
        self._sizes: dict[int, int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for item in tree_flatten(out)[0]:
            if isinstance(item, torch.Tensor):
                self._count(item.untyped_storage())
        return out

    def _count(self, storage: torch.UntypedStorage) -> None:
        key = storage._cdata  # the C++ storage: views and in-place results share it
        if key in self._sizes:
            return
        size = storage.nbytes()
        self._sizes[key] = size
        self.live += size
        self.peak = max(self.peak, self.live)
        # A storage's Python object lives as long as the C++ storage (PyTorch preserves it), so this
        # runs when the memory is freed, not when the last Python name goes.
        weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        self.live -= self._sizes.pop(key, 0)


def _status(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if value.strip().endswith(" kB"):
            out[key] = int(value.split()[0]) * 1024
    return out


def rss_bytes(pid: int, key: str = "VmRSS") -> int:
    """``VmRSS`` (resident now) or ``VmHWM`` (its high-water mark) of process ``pid``, in bytes."""
    return _status(pid)[key]


def reset_peak_rss(pid: int) -> None:
    """Set ``pid``'s ``VmHWM`` to its current RSS."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
