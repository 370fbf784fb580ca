"""A policy client whose weight updates can travel as tensors over a process group, not through the disk.

:class:`BroadcastingPolicy` is the client it wraps (every call passes through) plus
:meth:`~BroadcastingPolicy.update_weights_from_tensors`, which the driver uses when its trainer can
hand over full tensors (one process, full weights: :mod:`sandrl.train.session`). The engines
behind the client (one server, or every engine of a fleet: the router cannot broadcast, each engine
joins the group at its own rank) get them through :class:`~sandrl.inference.weight_push.WeightBroadcast`.
"""

from __future__ import annotations

from sandrl.inference.base import InferenceClient
from sandrl.inference.policy_wrapper import PolicyWrapper
from sandrl.inference.weight_push import BroadcastSpec


class BroadcastingPolicy(PolicyWrapper):
    """``inner``, whose engines take weights over a process group as ``spec`` says; see the module docstring."""

    def __init__(self, inner: InferenceClient, spec: BroadcastSpec) -> None:
        super().__init__(inner)
        self.spec = spec


def broadcast_spec(policy: InferenceClient) -> BroadcastSpec | None:
    """How to broadcast weights to ``policy``'s engines (``[inference] weight_sync``); None: by the disk only."""
    return policy.spec if isinstance(policy, BroadcastingPolicy) else None
