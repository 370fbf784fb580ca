"""A policy client whose weight updates can travel as tensors over a process group, not through the disk.

:class:`BroadcastingPolicy` is the client it wraps (every call passes through) plus
:meth:`~BroadcastingPolicy.update_weights_from_tensors`, which the driver uses when its trainer can
hand over full tensors (one process, full weights: :mod:`sandrl.train.driver_common`). The engines
behind the client (one server, or every engine of a fleet: the router cannot broadcast, each engine
joins the group at its own rank) get them through :class:`~sandrl.inference.weight_push.WeightBroadcast`.
"""

from __future__ import annotations

from typing import Any

from sandrl.inference.base import Generation, InferenceClient, SamplingParams
from sandrl.inference.tokenizer import Tokenizer
from sandrl.inference.weight_push import BroadcastSpec


class BroadcastingPolicy:
    """``inner``, whose engines take weights over a process group as ``spec`` says; see the module docstring."""

    def __init__(self, inner: InferenceClient, spec: BroadcastSpec) -> None:
        self.inner = inner
        self.spec = spec

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

    async def health(self) -> None:
        await self.inner.health()

    def __getattr__(self, name: str) -> Any:
        # Everything else a client may offer (versions, adapters, pause...) is the inner client's.
        return getattr(self.inner, name)


def broadcast_spec(policy: InferenceClient) -> BroadcastSpec | None:
    """How to broadcast weights to ``policy``'s engines (``[inference] weight_sync``); None: by the disk only."""
    return policy.spec if isinstance(policy, BroadcastingPolicy) else None
