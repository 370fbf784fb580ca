"""The policy's modules sharded across the training ranks with FSDP2 (``fully_shard``).

Each decoder layer is a unit of its own (its parameters gathered just before it runs and freed
after), and the root :class:`~sandrl.train.logprobs.PolicyForward` holds the rest (embeddings,
final norm, head). With ``dtype = "bf16"`` the sharded parameters stay float32 (the optimizer's
master copy), are gathered in bfloat16 for compute, and gradients are reduced in float32
(``MixedPrecisionPolicy``); ``offload_optimizer`` keeps shards and optimizer state in host memory
(``CPUOffloadPolicy``). Nothing here shards by hand: FSDP2 does it all.
"""

from __future__ import annotations

from typing import Any

import torch

from sandrl.errors import TrainError
from sandrl.train.config import TrainConfig
from sandrl.train.logprobs import PolicyForward


def decoder_layers(policy: PolicyForward) -> list[torch.nn.Module]:
    """The repeated blocks of the policy's decoder (``model.layers`` in Llama, Qwen and most HF LMs)."""
    layers = getattr(policy.decoder, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or not len(layers):
        raise TrainError(
            f"{type(policy.decoder).__name__} has no `layers` list of decoder blocks; sharding and activation "
            "checkpointing know Llama/Qwen-style models (model.layers)"
        )
    return list(layers)


def enable_activation_checkpointing(policy: PolicyForward) -> None:
    """Recompute each decoder layer in the backward pass (the model's own gradient checkpointing)."""
    inner: Any = policy.base
    if not getattr(inner, "supports_gradient_checkpointing", False):
        raise TrainError(f"{type(inner).__name__} does not support activation checkpointing; set it to false")
    if hasattr(inner, "activation_checkpointing_enable"):  # transformers >= 5.x
        inner.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        inner.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def shard(policy: PolicyForward, config: TrainConfig, device: torch.device) -> None:
    """``fully_shard`` every decoder layer, then the root, over the default process group."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mesh = init_device_mesh(device.type, (torch.distributed.get_world_size(),))
    precision = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if config.dtype == "bf16"
        else MixedPrecisionPolicy()
    )
    offload: OffloadPolicy = CPUOffloadPolicy() if config.offload_optimizer else OffloadPolicy()
    units: list[Any] = [
        fully_shard(layer, mesh=mesh, mp_policy=precision, offload_policy=offload) for layer in decoder_layers(policy)
    ]
    units.append(fully_shard(policy, mesh=mesh, mp_policy=precision, offload_policy=offload))
    for unit in units:
        # Each token's weight in the loss is fixed over the whole batch beforehand: gradients are
        # summed over the ranks, not averaged.
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)  # gloo has no pre-multiplied sum
