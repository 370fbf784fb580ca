"""A policy client in front of another: every call passes through unless the wrapper says otherwise.

What :class:`~sandrl.inference.broadcast_policy.BroadcastingPolicy` (weights over a process group) and
:class:`~sandrl.inference.kv_admission.AdmittedPolicy` (calls admitted by KV capacity) are built on: the
:class:`~sandrl.inference.base.InferenceClient` protocol forwarded explicitly (so a wrapper is one to the
type checker), and anything else a client may offer (versions, adapters, pause, memory, capacity
readings) found on the inner client by name.
"""

from __future__ import annotations

from typing import Any

from sandrl.inference.base import Generation, InferenceClient, SamplingParams
from sandrl.inference.tokenizer import Tokenizer


class PolicyWrapper:
    """``inner``, passed through; see the module docstring."""

    def __init__(self, inner: InferenceClient) -> None:
        self.inner = inner

    @property
    def tokenizer(self) -> Tokenizer | None:
        return self.inner.tokenizer

    @property
    def max_context(self) -> int | None:
        return self.inner.max_context

    async def generate(self, input_ids: list[int], params: SamplingParams) -> Generation:
        return await self.inner.generate(input_ids, params)

    async def update_weights(self, path: str, *, version: int | None = None) -> int:
        return await self.inner.update_weights(path, version=version)

    async def health(self) -> None:
        await self.inner.health()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
