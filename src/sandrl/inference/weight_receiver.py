"""The engine's side of broadcast weight updates: join the group, receive buckets, stage, hand over whole.

Each ``/update_weights_from_distributed`` call names a bucket (``names``, ``dtypes``, ``shapes``)
that the trainer broadcasts at the same time. The receiver

1. checks the bucket's form (as many names as dtypes and shapes, weight dtypes, sizes that fit the
   model) before it receives anything; a bucket that fails there cannot be received, so the group
   is closed at once (the trainer's broadcast fails at once instead of waiting out its timeout);
2. receives every tensor into a buffer of the declared shape and dtype: the group stays in step
   whatever the bucket holds;
3. checks each tensor against the served model (a parameter of that name, the same shape, a
   floating dtype, cast to the model's as the disk path casts): a bucket with one wrong tensor is
   refused whole, naming it, and nothing of it is kept;
4. stages the bucket's tensors; once the staged tensors cover every weight of the model (tied
   weights count once), hands the whole state over to be swapped in as one update, under the
   engine's update policy, as a checkpoint read from disk is. Until then nothing is applied, so a
   push broken off half way never leaves the engine serving half-new weights.

The swap takes the received tensors as the model's own; the tensors they replaced come back
(:meth:`WeightReceiver.recycle`) and the next push is received into them: fresh buffers cost a page
fault per 4 KiB on first touch, about as long as the broadcast itself on a CPU host (the engine holds
one spare copy of its weights between pushes for that, let go with the weights' memory).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Any

import torch

from sandrl.errors import ConfigError, InferenceError
from sandrl.inference.weight_group import GroupAddress, GroupMember, join_group, parse_dtype

MAX_GROUPS = 4
SLACK_BYTES = 64 * 2**20
"""What a bucket may declare beyond the model's own size (a model's weights in float64, say)."""


class WeightReceiver:
    """The weight-update groups of one engine and the update being staged; thread-safe."""

    def __init__(self, model: Any) -> None:
        state = model.state_dict()
        self._shapes = {name: (tuple(t.shape), t.dtype) for name, t in state.items()}
        # Tied weights (an embedding shared with the output layer) are one tensor under two names: a
        # trainer may send either name (named_parameters() lists one), and both are then staged.
        by_storage: dict[tuple[int, int], list[str]] = {}
        for name, t in state.items():
            by_storage.setdefault((t.untyped_storage().data_ptr(), t.storage_offset()), []).append(name)
        self._aliases = {name: tuple(names) for names in by_storage.values() for name in names}
        self._needed = len(by_storage)
        self._limit = 2 * sum(t.numel() * t.element_size() for t in state.values()) + SLACK_BYTES
        self._groups: dict[str, GroupMember] = {}
        self._staged: dict[str, torch.Tensor] = {}
        self._spares: dict[str, torch.Tensor] = {}
        self._lock = threading.Lock()

    @property
    def groups(self) -> list[str]:
        with self._lock:
            return sorted(self._groups)

    def join(self, address: GroupAddress, rank: int, *, timeout_s: float = 300.0) -> None:
        """Join ``address``'s group as ``rank`` (blocking until every rank has: run it in a worker thread)."""
        with self._lock:
            if address.group_name in self._groups:
                raise ConfigError(
                    f"this engine is already in the weight-update group {address.group_name!r}; "
                    "destroy it first (/destroy_weights_update_group) or use another name"
                )
            if len(self._groups) >= MAX_GROUPS:
                raise ConfigError(f"this engine is in {MAX_GROUPS} weight-update groups already; destroy one first")
        group = join_group(address, rank, timeout_s=timeout_s)
        with self._lock:
            self._groups[address.group_name] = group

    def leave(self, group_name: str) -> None:
        with self._lock:
            group = self._groups.pop(group_name, None)
            if group is None:
                raise ConfigError(f"this engine is in no weight-update group {group_name!r}")
            self._staged.clear()
            self._spares = {}
        group.close()

    def receive(
        self, group_name: str, names: Sequence[object], dtypes: Sequence[object], shapes: Sequence[object]
    ) -> dict[str, torch.Tensor] | None:
        """Receive one bucket (blocking); the whole new state once the staged buckets cover the model, else None."""
        with self._lock:
            group = self._groups.get(group_name)
        if group is None:
            raise ConfigError(
                f"this engine is in no weight-update group {group_name!r}: join it first (/init_weights_update_group)"
            )
        try:
            declared = self._declared(names, dtypes, shapes)
        except ConfigError:
            self.leave(group_name)  # out of step with the sender now: close it so its broadcast fails fast
            raise
        buffers = [self._buffer(name, dtype, shape, group.device) for name, dtype, shape in declared]
        try:
            group.broadcast(buffers)
        except InferenceError:
            self.leave(group_name)
            raise
        bucket = {name: buffer.cpu() for (name, _, _), buffer in zip(declared, buffers, strict=True)}
        checked = {name: self._checked(name, tensor) for name, tensor in bucket.items()}
        with self._lock:
            for name, tensor in checked.items():
                for alias in self._aliases[name]:
                    self._staged[alias] = tensor
            if len({self._aliases[n] for n in self._staged}) < self._needed:
                return None
            state, self._staged = self._staged, {}
        return state

    def recycle(self, replaced: dict[str, torch.Tensor]) -> None:
        """Keep ``replaced`` (the model's tensors that a swap let go, no longer the model's) to receive into."""
        with self._lock:
            self._spares = {name: t for name, t in replaced.items() if name in self._shapes}

    def drop_spares(self) -> None:
        """Let go of the tensors kept to receive into (the engine releases its weights' memory)."""
        with self._lock:
            self._spares = {}

    def _buffer(
        self, name: str, dtype: torch.dtype, shape: tuple[int, ...], device: torch.device | None
    ) -> torch.Tensor:
        with self._lock:  # a tied weight's names share one tensor: it is received into once
            spares = [self._spares.pop(alias, None) for alias in self._aliases.get(name, (name,))]
        spare = next((t for t in spares if t is not None), None)
        wanted = device or torch.device("cpu")
        if spare is not None and (spare.dtype, tuple(spare.shape), spare.device) == (dtype, shape, wanted):
            return spare
        return torch.empty(shape, dtype=dtype, device=device)

    def missing(self) -> list[str]:
        """The weights the update being staged still lacks (one name per tied set), in the model's order."""
        with self._lock:
            have = {self._aliases[n] for n in self._staged}
        return [names[0] for names in dict.fromkeys(self._aliases.values()) if names not in have]

    def _declared(
        self, names: Sequence[object], dtypes: Sequence[object], shapes: Sequence[object]
    ) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        if not isinstance(names, list | tuple) or not names:
            raise ConfigError("names must be a non-empty list of tensor names")
        if not isinstance(dtypes, list | tuple) or not isinstance(shapes, list | tuple):
            raise ConfigError("dtypes and shapes must be lists, one entry per name")
        if not len(names) == len(dtypes) == len(shapes):
            raise ConfigError(
                f"a bucket needs one dtype and one shape per name: {len(names)} names, "
                f"{len(dtypes)} dtypes, {len(shapes)} shapes"
            )
        out: list[tuple[str, torch.dtype, tuple[int, ...]]] = []
        total = 0
        for name, dtype, shape in zip(names, dtypes, shapes, strict=True):
            if not isinstance(name, str) or not name:
                raise ConfigError(f"a tensor name must be a non-empty string, got {name!r}")
            dims = _shape(shape, name)
            parsed = parse_dtype(dtype, name)
            total += math.prod(dims) * parsed.itemsize
            out.append((name, parsed, dims))
        if total > self._limit:
            raise ConfigError(
                f"the bucket declares {total} bytes, more than twice the served model's weights: "
                "send buckets of this model's own tensors"
            )
        return out

    def _checked(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        served = self._shapes.get(name)
        if served is None:
            raise ConfigError(
                f"tensor {name!r} is not a weight of the served model: push the architecture it was started with",
                error_code="bad_weight_name",
            )
        shape, dtype = served
        if tuple(tensor.shape) != shape:
            raise ConfigError(
                f"tensor {name!r} has shape {list(tensor.shape)}, the served model's has {list(shape)}",
                error_code="bad_weight_shape",
            )
        return tensor.to(dtype)

    def close(self) -> None:
        with self._lock:
            groups, self._groups = list(self._groups.values()), {}
            self._staged.clear()
        for group in groups:
            group.close()


def _shape(shape: object, name: str) -> tuple[int, ...]:
    if not isinstance(shape, list | tuple) or len(shape) > 8:
        raise ConfigError(f"tensor {name!r}: shape must be a list of at most 8 sizes, got {shape!r}")
    dims = []
    for size in shape:
        if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size < 2**40:
            raise ConfigError(f"tensor {name!r}: shape must hold sizes >= 0, got {shape!r}")
        dims.append(size)
    return tuple(dims)
