"""The embedded engine's weights: updates from disk or broadcast over a process group, and LoRA adapters.

A mixin of :class:`~sandrl.inference.engine.Engine` (its state lives there): what reads new weights on
the callers' side and queues them, and the swap the engine thread makes between two steps. Every way
in (a checkpoint directory, an adapter directory, a broadcast update staged whole by
:class:`~sandrl.inference.weight_receiver.WeightReceiver`) ends as one :class:`WeightUpdate`, swapped
under the update policy, so the policies and the per-token versions hold on every path.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from sandrl.errors import ConfigError, InferenceError
from sandrl.inference.base import UPDATE_POLICIES, UpdatePolicy
from sandrl.inference.batch import Request, WeightUpdate, deliver, deliver_error
from sandrl.inference.engine_config import EngineConfig, EngineStats
from sandrl.inference.lora_adapter import LoraAdapter, check_adapter_name, read_adapter
from sandrl.inference.lora_client import is_adapter_dir
from sandrl.inference.lora_registry import AdapterRegistry
from sandrl.inference.model import load_weights
from sandrl.inference.prefix_cache import PrefixCache
from sandrl.inference.weight_group import GroupAddress
from sandrl.inference.weight_receiver import WeightReceiver

log = logging.getLogger(__name__)


class EngineWeights:
    """Weight updates and adapters of the engine; see the module docstring."""

    config: EngineConfig
    stats: EngineStats
    model_path: str
    prefix_cache: PrefixCache
    _model: Any
    _cv: threading.Condition
    _updates: list[WeightUpdate]
    _inflight: set[Request]
    _waiting: deque[Request]
    _adapters: AdapterRegistry
    _max_rank: int
    _policy_adapter: LoraAdapter | None
    _weight_version: int
    _receiver: WeightReceiver | None = None
    _offloaded: Path | None
    """Where the weights wait while released (:mod:`~sandrl.inference.engine_memory`); None: in the model."""

    def _check_alive(self) -> None:
        raise NotImplementedError

    async def update_weights(self, path: str, *, version: int | None = None, policy: UpdatePolicy | None = None) -> int:
        """Load the checkpoint at ``path`` and swap it in between two decode steps; return the new version.

        The checkpoint is read and checked in a worker thread while decoding goes on; only
        the copy into the live model happens on the engine thread, between steps.
        ``version`` sets the new version explicitly (SGLang's ``weight_version``); by
        default it is the current one plus one. ``policy`` (default: the engine's
        ``update_policy``) says what happens to requests in flight; see :data:`UpdatePolicy`.
        While the engine is paused the swap happens at once whatever the policy: whoever
        paused it already chose the fate of the requests in flight.

        A LoRA adapter directory (``adapter_config.json``, no ``config.json``: what ``export_lora`` writes)
        is served over the base weights the same way, to every request that names no other adapter
        (:attr:`lora_adapter`); only the adapter is read and held. A full checkpoint drops it again.
        """
        self._check_alive()
        self._check_resident()
        chosen = policy or self.config.update_policy
        if chosen not in UPDATE_POLICIES:
            raise ConfigError(f"unknown weight-update policy {chosen!r}; use one of {', '.join(UPDATE_POLICIES)}")
        state, adapter = None, None
        if is_adapter_dir(path):
            adapter = await asyncio.to_thread(read_adapter, path, self._model, name=path, max_rank=self._max_rank)
        else:
            state = await asyncio.to_thread(load_weights, self._model, path)
        return await self._queue(state, path, version, chosen, adapter)

    async def _queue(
        self,
        state: dict[str, torch.Tensor] | None,
        path: str,
        version: int | None,
        policy: UpdatePolicy,
        adapter: LoraAdapter | None = None,
        *,
        owned: bool = False,
    ) -> int:
        self._check_resident()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        with self._cv:
            self._updates.append(WeightUpdate(state, path, version, policy, loop, future, adapter, owned))
            self._cv.notify()
        return await future

    def _check_resident(self) -> None:
        if self._offloaded is not None:
            raise ConfigError(
                "the engine's weights are released (/release_memory_occupation): resume them first "
                '(/resume_memory_occupation with tags ["weights"]), then update them',
                error_code="weights_released",
            )

    # -- weights over a process group (SGLang's /init_weights_update_group, /update_weights_from_distributed) --

    async def init_weights_update_group(self, address: GroupAddress, rank: int, *, timeout_s: float = 300.0) -> None:
        """Join the trainer's weight-update group as ``rank`` (returns once every rank has joined)."""
        self._check_alive()
        if self._receiver is None:
            self._receiver = WeightReceiver(self._model)
        await asyncio.to_thread(self._receiver.join, address, rank, timeout_s=timeout_s)
        log.info(
            "joined weight-update group %s as rank %d of %d (backend %s)",
            address.group_name,
            rank,
            address.world_size,
            address.backend,
        )

    async def update_weights_from_distributed(
        self,
        group_name: str,
        names: Sequence[object],
        dtypes: Sequence[object],
        shapes: Sequence[object],
        *,
        version: int | None = None,
        policy: UpdatePolicy | None = None,
    ) -> int | None:
        """Receive one bucket the trainer broadcasts now; once the buckets received cover every weight, swap
        them in as one update (``version``, else the current one plus one) and return the new version;
        None while the update is still being staged (see :mod:`~sandrl.inference.weight_receiver`)."""
        self._check_alive()
        self._check_resident()
        chosen = policy or self.config.update_policy
        if chosen not in UPDATE_POLICIES:
            raise ConfigError(f"unknown weight-update policy {chosen!r}; use one of {', '.join(UPDATE_POLICIES)}")
        if self._receiver is None:
            raise ConfigError("this engine is in no weight-update group: join one first (/init_weights_update_group)")
        state = await asyncio.to_thread(self._receiver.receive, group_name, names, dtypes, shapes)
        if state is None:
            return None
        return await self._queue(state, f"broadcast:{group_name}", version, chosen, owned=True)

    async def destroy_weights_update_group(self, group_name: str) -> None:
        if self._receiver is None:
            raise ConfigError(f"this engine is in no weight-update group {group_name!r}")
        await asyncio.to_thread(self._receiver.leave, group_name)

    def weights_not_staged(self) -> list[str]:
        """What a broadcast update being staged still lacks (empty when none is being staged)."""
        return self._receiver.missing() if self._receiver is not None else []

    @property
    def weight_update_groups(self) -> list[str]:
        return self._receiver.groups if self._receiver is not None else []

    update_weights_from_disk = update_lora_adapter = update_weights

    # -- LoRA adapters (SGLang's /load_lora_adapter, /unload_lora_adapter, /generate lora_path) ------------

    @property
    def lora_adapter(self) -> str | None:
        """The adapter (its path) that :meth:`update_weights` put over the base for requests naming none."""
        adapter = self._policy_adapter
        return adapter.path if adapter is not None else None

    @property
    def lora_adapters(self) -> dict[str, str]:
        """The adapters loaded by :meth:`load_lora_adapter`, which requests may name: name -> path."""
        with self._cv:
            return self._adapters.paths()

    async def load_lora_adapter(self, name: str, path: str) -> None:
        """Load the adapter directory ``path`` under ``name``; a ConfigError when ``name`` is taken, ``max_loras``
        are held, or the files do not fit the served model (:func:`~sandrl.inference.lora_adapter.read_adapter`)."""
        self._check_alive()
        with self._cv:
            self._adapters.check_room(check_adapter_name(name), (r.adapter for r in self._inflight))
        adapter = await asyncio.to_thread(read_adapter, path, self._model, name=name, max_rank=self._max_rank)
        with self._cv:
            self._adapters.add(adapter, (r.adapter for r in self._inflight))

    async def unload_lora_adapter(self, name: str) -> None:
        """Forget the adapter ``name``; requests already running with it finish with it."""
        with self._cv:
            self._adapters.remove(name)

    # -- the engine thread's side -------------------------------------------------------------------------

    def _swap(self, update: WeightUpdate) -> None:
        try:
            if update.state is not None:
                recycled = self._model.state_dict() if update.owned and self._receiver is not None else None
                self._model.load_state_dict(update.state, strict=True, assign=update.owned)
                if recycled is not None and self._receiver is not None:
                    self._receiver.recycle(recycled)  # the next push is received into them
        except Exception as exc:
            deliver_error(update.loop, update.future, InferenceError(f"swapping in {update.path} failed: {exc}"))
            return
        self.prefix_cache.clear()  # KV of the old weights is never reused
        self._weight_version = update.version if update.version is not None else self._weight_version + 1
        self._policy_adapter = update.adapter
        if update.adapter is None:
            self.model_path = update.path
        self.stats.weight_updates += 1
        deliver(update.loop, update.future, self._weight_version)
