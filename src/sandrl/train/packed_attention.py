"""Packed rows attended sample by sample: a varlen attention for models without flash-attention.

A packed row holds several samples end to end, each with positions from 0 (see
:mod:`sandrl.train.micro_batches`). flash-attention's varlen kernel attends within each sample and
takes no mask; without it, Hugging Face models give SDPA a block-causal ``row x row`` mask, whose
cost grows with the row's square (one 16k-token row of short samples: 193 s a step against 12 s
padded, on this project's CPU), so packed rows had to stay narrow and kept ~5% padding.

:func:`use_packed_attention` switches a model to :data:`NAME`, registered with ``transformers``'
``AttentionInterface``: each row is cut where its positions restart, and every piece goes through
causal SDPA on its own (grouped-query heads kept grouped). The cost is that of the samples, not of
the row, no mask is built, and a row can be the whole token budget. Any other forward (a
generation with a cache, rows with a padding mask) is SDPA's, mask included, so a switched model
still generates as before.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

NAME = "sandrl_packed"
"""The attention implementation's name in ``transformers``' registry."""

VARLEN = ("flash_attention", NAME)
"""Prefixes of the implementations that attend within each packed sample without a mask."""


def attends_per_sample(model: Any) -> bool:
    """Whether ``model`` attends within each sample of a packed row without a row x row mask."""
    attention = str(getattr(model.config, "_attn_implementation", "") or "")
    return attention.startswith(VARLEN)


def use_packed_attention(model: Any) -> bool:
    """Switch ``model`` (SDPA or eager) to :data:`NAME`; whether it now attends per sample.

    flash-attention is kept (its varlen kernel does the same); a sliding window, flex attention or a
    model that cannot change its implementation keep theirs, and the trainer's rows stay narrow.
    """
    if attends_per_sample(model):
        return True
    config = model.config
    if str(getattr(config, "_attn_implementation", "") or "") not in ("sdpa", "eager"):
        return False
    sliding = any(kind == "sliding_attention" for kind in getattr(config, "layer_types", None) or ())
    if sliding or getattr(config, "use_sliding_window", False):
        return False
    if not getattr(model, "_can_set_attn_implementation", lambda: False)():
        return False
    register()
    model.set_attn_implementation(NAME)
    return attends_per_sample(model)


def register() -> None:
    """Add :data:`NAME` to ``transformers``' attention and mask registries (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, packed_attention_forward)
    AttentionMaskInterface.register(NAME, _mask)


def _mask(*, attention_mask: torch.Tensor | None, q_length: int, kv_length: int, q_offset: int, **kwargs: Any) -> Any:
    """No mask for a training forward (every query and key of the rows, nothing masked but the
    samples' borders, which :func:`packed_attention_forward` keeps); SDPA's mask otherwise (a
    generation with a cache, padded rows), which that forward hands to SDPA as it is."""
    from transformers.masking_utils import sdpa_mask

    if attention_mask is None and q_offset == 0 and q_length == kv_length:
        return None
    return sdpa_mask(attention_mask=attention_mask, q_length=q_length, kv_length=kv_length, q_offset=q_offset, **kwargs)


def packed_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    position_ids: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, Any]:
    """Causal attention within each run of positions counting up from 0 (``[batch, heads, seq, dim]`` in).

    Returns ``[batch, seq, heads, dim]``, as ``transformers``' attention functions do. Without
    ``position_ids`` each row is one sequence. Padding sits at a row's end as a sequence of its own,
    which no sample attends to. With a mask or a cache (generation), SDPA as ``transformers`` calls it.

    Samples of similar length are gathered into one batch for a single SDPA call (a bucket's
    shortest is at least :data:`BUCKET_RATIO` of its longest, so the padding inside attention stays
    small), and scattered back: a few calls a layer, whatever the number of samples.
    """
    if attention_mask is not None or key.shape[2] != query.shape[2]:  # not a training forward: see _mask
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    batch, heads, length, dim = query.shape
    grouped = key.shape[1] != heads
    flat = [t.transpose(1, 2).reshape(batch * length, t.shape[1], dim) for t in (query, key, value)]
    plan = _plan(position_ids, batch, length, query.device)
    pieces: list[torch.Tensor] = []
    for index, inside in plan.buckets:
        q, k, v = (t[index].transpose(1, 2) for t in flat)
        attended = F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout, is_causal=True, scale=scaling, enable_gqa=grouped
        ).transpose(1, 2)
        pieces.append(attended[inside])
    return torch.cat(pieces)[plan.order].reshape(batch, length, heads, dim), None


@dataclass(frozen=True)
class _Plan:
    """How one forward's rows are cut and gathered: per bucket, the gather index and which of its
    places are inside a sample; and the order that scatters the results back."""

    buckets: list[tuple[torch.Tensor, torch.Tensor]]
    order: torch.Tensor


_LAST: list[tuple[weakref.ref[torch.Tensor], tuple[int, int, int, str], _Plan]] = []
"""The plan of the forward in flight, with its ``position_ids`` (held weakly): every layer of a
forward gets that same tensor, so the plan (a host sync to read the samples' borders, a few small
tensors) is made once per forward, not once per layer. One slot: forwards run one at a time."""


def _plan(position_ids: torch.Tensor | None, batch: int, length: int, device: torch.device) -> _Plan:
    key = (position_ids._version if position_ids is not None else -1, batch, length, str(device))
    if position_ids is not None and _LAST:
        ref, last_key, last_plan = _LAST[0]
        if ref() is position_ids and last_key == key:
            return last_plan
    buckets = []
    places = []
    for starts, lengths in _buckets(_segments(position_ids, batch, length)):
        width = max(lengths)
        offsets = torch.arange(width)
        starts_t, lengths_t = torch.tensor(starts), torch.tensor(lengths)
        inside = offsets[None, :] < lengths_t[:, None]
        # Positions past a sample's end read its first token: causal attention keeps them from the
        # sample's own queries, and their outputs are dropped.
        index = (starts_t[:, None] + torch.where(inside, offsets[None, :], 0)).to(device)
        inside = inside.to(device)
        buckets.append((index, inside))
        places.append(index[inside])
    plan = _Plan(buckets, torch.argsort(torch.cat(places)))
    if position_ids is not None:
        _LAST[:] = [(weakref.ref(position_ids), key, plan)]
    return plan


BUCKET_RATIO = 0.8
"""The shortest sample of an attention bucket is at least this share of its longest."""


def _segments(position_ids: torch.Tensor | None, batch: int, length: int) -> list[tuple[int, int]]:
    """``(start, length)`` of every sample, counted over the flattened ``batch x length`` tokens."""
    if position_ids is None:
        return [(row * length, length) for row in range(batch)]
    positions = position_ids.expand(batch, length).reshape(-1)
    starts = (torch.diff(positions, prepend=positions[:1] - 1) != 1).nonzero().flatten()
    # Every row starts a sample, even if its positions continue the row before.
    edges = sorted({*starts.tolist(), *range(0, batch * length, length)})
    return [(a, b - a) for a, b in zip(edges, [*edges[1:], batch * length], strict=True)]


def _buckets(segments: list[tuple[int, int]]) -> list[tuple[list[int], list[int]]]:
    """The segments longest first, cut into buckets whose lengths stay within :data:`BUCKET_RATIO`."""
    out: list[tuple[list[int], list[int]]] = []
    for start, size in sorted(segments, key=lambda s: -s[1]):
        if out and size >= BUCKET_RATIO * out[-1][1][0]:
            out[-1][0].append(start)
            out[-1][1].append(size)
        else:
            out.append(([start], [size]))
    return out
