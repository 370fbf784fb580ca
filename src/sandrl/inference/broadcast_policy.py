"""A policy client whose weight updates can travel as tensors over a process group, not through the disk.

:class:`BroadcastingPolicy` is the client it wraps (every call passes through) plus the
:class:`~sandrl.inference.weight_push.BroadcastSpec` of its engines, which the driver hands to the
trainer's rank 0 when its trainer can send full tensors (:func:`push_broadcast`). The engines behind
the client (one server, or every engine of a fleet: the router cannot broadcast, each engine joins the
group at its own rank) get them through :class:`~sandrl.inference.weight_push.WeightBroadcast`.

Behind a fleet (:class:`BroadcastTargets`) the group follows the engines: it is formed with those that
are up, formed again after one was lost or came back, and a push that the fleet changed under (an
engine died mid-push) is made once more with the group as it is now. An engine that comes back after a
push missed it stays out of service until the next push reaches it (a broadcast cannot be replayed as a
checkpoint on disk can: :class:`~sandrl.inference.fleet.proxy.Replay`).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Protocol

from sandrl.inference.base import InferenceClient
from sandrl.inference.policy_wrapper import PolicyWrapper
from sandrl.inference.weight_push import BroadcastSpec


class BroadcastTargets(Protocol):
    """The engines a broadcast reaches, as their fleet knows them (:class:`~sandrl.inference.fleet.serve.Fleet`)."""

    def group_members(self) -> tuple[str, ...]:
        """The engines' URLs to form the group with now."""
        ...

    def group_epoch(self) -> int:
        """Bumped whenever an engine is lost: a group formed before is formed again."""
        ...

    def weights_broadcast(self, version: int) -> None:
        """Weights ``version`` reached every member: one that comes back without them waits for the next push."""
        ...


class BroadcastingPolicy(PolicyWrapper):
    """``inner``, whose engines take weights over a process group as ``spec`` says; see the module docstring."""

    def __init__(self, inner: InferenceClient, spec: BroadcastSpec, targets: BroadcastTargets | None = None) -> None:
        super().__init__(inner)
        self._spec = spec
        self.targets = targets

    @property
    def spec(self) -> BroadcastSpec:
        """The spec with the engines of the fleet as they are now (a spec that differs forms a new group)."""
        if self.targets is None:
            return self._spec
        return dataclasses.replace(self._spec, urls=self.targets.group_members(), epoch=self.targets.group_epoch())


async def push_broadcast(
    policy: BroadcastingPolicy, push: Callable[[BroadcastSpec], str | None], version: int
) -> str | None:
    """Run ``push`` (the trainer's, blocking: in a worker thread) with the engines' spec; None once every engine
    up serves ``version``, else why not. A push whose group changed under it is made once more."""
    spec = policy.spec
    if not spec.urls:
        return "no inference engine is up to take the weights (they are restarting)"
    why = await asyncio.to_thread(push, spec)
    if why is not None and (now := policy.spec) != spec and now.urls:
        why = await asyncio.to_thread(push, now)
    if why is None and policy.targets is not None:
        policy.targets.weights_broadcast(version)
    return why
