"""A policy client whose weight updates can travel as tensors over a process group, not through the disk.

:class:`BroadcastingPolicy` is the client it wraps (every call passes through) plus
:meth:`~BroadcastingPolicy.update_weights_from_tensors`, which the driver uses when its trainer can
hand over full tensors (one process, full weights: :mod:`sandrl.train.driver_common`). The engines
behind the client (one server, or every engine of a fleet: the router cannot broadcast, each engine
joins the group at its own rank) get them through :class:`~sandrl.inference.weight_push.WeightBroadcast`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from sandrl.inference.base import Generation, InferenceClient, SamplingParams
from sandrl.inference.tokenizer import Tokenizer
from sandrl.inference.weight_push import WeightBroadcast


class BroadcastingPolicy:
    """``inner`` with weight updates over ``broadcast``; see the module docstring."""

    def __init__(self, inner: InferenceClient, broadcast: WeightBroadcast) -> None:
        self.inner = inner
        self.broadcast = broadcast

    @property
    def tokenizer(self) -> Tokenizer | None:
        return self.inner.tokenizer

    @property
    def max_context(self) -> int | None:
        return self.inner.max_context

    async def generate(self, input_ids: list[int], params: SamplingParams) -> Generation:
        return await self.inner.generate(input_ids, params)

    async def update_weights(self, path: str, *, version: int | None = None) -> int:
        """The disk path, as the inner client does it (the fallback, and LoRA adapters)."""
        return await self.inner.update_weights(path, version=version)

    async def update_weights_from_tensors(self, tensors: Iterable[tuple[str, torch.Tensor]], *, version: int) -> int:
        """Broadcast every weight in ``tensors`` (name, full tensor) to the engines as ``version``."""
        return await self.broadcast.push(tensors, version=version)

    async def health(self) -> None:
        await self.inner.health()

    async def aclose(self) -> None:
        await self.broadcast.shutdown()

    def __getattr__(self, name: str) -> Any:
        # Everything else a client may offer (versions, adapters, pause...) is the inner client's.
        return getattr(self.inner, name)


def tensor_receiver(policy: InferenceClient) -> BroadcastingPolicy | None:
    """``policy`` when its weight updates can be tensors (``[inference] weight_sync``), else None."""
    return policy if isinstance(policy, BroadcastingPolicy) else None
