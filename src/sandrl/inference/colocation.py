"""Colocated runs (``[inference] colocate = true``): the engines share the trainer's GPUs, so they hand
their memory over for the train step and take it back after, in SGLang's order (what Miles and slime do):

1. before the step: release the KV cache and the weights (``/release_memory_occupation``; vLLM: ``/sleep``);
2. after the step: resume the weights, load the new ones into them, then resume the KV cache
   (``/resume_memory_occupation``; vLLM: ``/wake_up``), and generation goes on.

Each call is timed: what colocation costs a step is in its record (``colocate/release_s``,
``colocate/resume_s``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from sandrl.errors import ConfigError


@runtime_checkable
class SharesMemory(Protocol):
    """A policy whose engines can release their memory and resume it: sandrl's engine, SGLang, vLLM."""

    async def release_memory_occupation(self, tags: Sequence[str] | None = None) -> Any: ...

    async def resume_memory_occupation(self, tags: Sequence[str] | None = None) -> Any: ...


def sharing(policy: object) -> SharesMemory:
    """``policy`` as one that shares memory; a ConfigError naming the fix when it cannot."""
    if not isinstance(policy, SharesMemory):
        raise ConfigError(
            f"[inference] colocate = true needs engines that release their memory (sandrl's, SGLang's or vLLM's); "
            f"this policy ({type(policy).__name__}) cannot: set colocate = false"
        )
    return policy


async def release(policy: SharesMemory) -> float:
    """Release the KV cache and the weights; the seconds it took."""
    started = time.perf_counter()
    await policy.release_memory_occupation(["kv_cache", "weights"])
    return time.perf_counter() - started


async def resume(policy: SharesMemory, tags: Sequence[str]) -> float:
    """Resume ``tags`` (``weights`` before a weight update, ``kv_cache`` after it); the seconds it took."""
    started = time.perf_counter()
    await policy.resume_memory_occupation(list(tags))
    return time.perf_counter() - started
