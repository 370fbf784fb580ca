"""The embedded engine's memory handed to a colocated trainer and taken back (SGLang's
``/release_memory_occupation`` and ``/resume_memory_occupation``).

A mixin of :class:`~sandrl.inference.engine.Engine`. What each tag frees, for real:

- ``kv_cache``: generation pauses; the running requests drop their KV and wait (retracted, to be
  prefilled again with the tokens they have, as SGLang's ``retract`` pause does), and the prefix
  cache empties. Resuming ``kv_cache`` continues generation.
- ``weights``: generation pauses too (nothing can run without them); the weights are written to a
  file of the engine's own (its checkpoint, in this host's temporary directory) and every parameter's
  storage is let go. Resuming ``weights`` reads them back, bit for bit, so what the engine samples
  after is what it sampled before; a weight update must wait for that (it is refused meanwhile), as
  a colocated run resumes weights, then updates them, then resumes the KV cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from sandrl.errors import ConfigError
from sandrl.inference.batch import PauseMode
from sandrl.inference.prefix_cache import PrefixCache
from sandrl.inference.weight_receiver import WeightReceiver

MEMORY_TAGS = ("kv_cache", "weights")
"""What the CPU engine holds; SGLang's ``cuda_graph`` tag is accepted and means nothing here."""


class EngineMemory:
    """Release and resume of the engine's memory; see the module docstring."""

    prefix_cache: PrefixCache
    _model: Any
    _cv: threading.Condition
    _offloaded: Path | None = None
    _receiver: WeightReceiver | None = None
    _memory_released: frozenset[str] = frozenset()

    async def pause(self, mode: PauseMode = "abort") -> None:
        raise NotImplementedError

    async def continue_generation(self) -> None:
        raise NotImplementedError

    async def flush_cache(self) -> None:
        raise NotImplementedError

    @property
    def memory_released(self) -> frozenset[str]:
        """The tags released and not resumed yet."""
        return self._memory_released

    async def release_memory_occupation(self, tags: Sequence[str] | None = None) -> int:
        """Let go of ``tags`` (default: all); returns the bytes of weights freed (0 for the KV cache alone)."""
        chosen = _checked(tags)
        if not chosen:
            return 0
        await self.pause("retract")
        await self.flush_cache()
        freed = 0
        if "weights" in chosen and self._offloaded is None:
            freed = await asyncio.to_thread(self._offload_weights)
        self._memory_released = self._memory_released | chosen
        return freed

    async def resume_memory_occupation(self, tags: Sequence[str] | None = None) -> None:
        """Take ``tags`` back (default: all): weights read back as they were; generation goes on once nothing
        is released any more."""
        chosen = _checked(tags)
        if "weights" in chosen and self._offloaded is not None:
            await asyncio.to_thread(self._reload_weights)
        self._memory_released = self._memory_released - chosen
        if chosen and not self._memory_released:
            await self.continue_generation()

    def _offload_weights(self) -> int:
        directory = Path(tempfile.mkdtemp(prefix="sandrl-engine-weights-"))
        path = directory / "weights.pt"
        with self._cv:  # the engine thread is paused; the lock keeps a swap from racing the move
            params = dict(self._model.named_parameters())
            torch.save({name: p.data for name, p in params.items()}, path)
            freed = 0
            for p in params.values():
                freed += p.numel() * p.element_size()
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)
            self._offloaded = path
            if self._receiver is not None:
                self._receiver.drop_spares()
        return freed

    def _reload_weights(self) -> None:
        assert self._offloaded is not None
        saved: dict[str, torch.Tensor] = torch.load(self._offloaded, weights_only=True)
        with self._cv:
            for name, p in self._model.named_parameters():
                p.data = saved[name]
            path, self._offloaded = self._offloaded, None
        with contextlib.suppress(OSError):
            path.unlink()
            path.parent.rmdir()


def _checked(tags: Sequence[str] | None) -> frozenset[str]:
    if tags is None:
        return frozenset(MEMORY_TAGS)
    unknown = sorted(set(tags) - {*MEMORY_TAGS, "cuda_graph"})
    if unknown:
        raise ConfigError(f"unknown memory tags {unknown}; SGLang's are ['cuda_graph', 'kv_cache', 'weights']")
    return frozenset(tags) & frozenset(MEMORY_TAGS)
