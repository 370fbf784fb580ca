"""Per-sample sums over a micro-batch whose rows may hold several samples end to end (packing).

Sequence-level quantities (GSPO's ratio, a sequence's importance weight) are sums over one
sample's model tokens. A micro-batch says which sample each position belongs to with
``sample_ids``, a ``[rows, width]`` long tensor: the sample's position within the micro-batch
(0, 1, ...), or -1 on padding (:attr:`~sandrl.train.micro_batches.MicroBatch.sample_ids`).
Sums are one ``index_add`` over the flattened positions, whatever the layout, so a packed row
and the same samples padded one per row give the same numbers.
"""

from __future__ import annotations

import torch


def row_sample_ids(shape: torch.Size | tuple[int, ...], device: torch.device | str = "cpu") -> torch.Tensor:
    """``sample_ids`` of a padded layout: row ``r`` is sample ``r``, every position of it."""
    rows, width = shape
    return torch.arange(rows, device=device).unsqueeze(-1).expand(rows, width)


def sample_count(sample_ids: torch.Tensor) -> int:
    """The number of samples ``sample_ids`` names (its largest id + 1)."""
    return int(sample_ids.max()) + 1 if sample_ids.numel() else 0


def per_sample_sum(values: torch.Tensor, sample_ids: torch.Tensor, keep: torch.Tensor, samples: int) -> torch.Tensor:
    """``[samples]``: the sum of ``values`` over each sample's kept positions (0 for a sample with none).

    Positions that are not kept (or are padding) go to a spare slot that is dropped, so whatever
    they hold (a placeholder, an infinity) cannot reach a sum.
    """
    kept = keep & (sample_ids >= 0)
    slot = torch.where(kept, sample_ids, samples).reshape(-1)
    out = torch.zeros(samples + 1, dtype=values.dtype, device=values.device)
    out.index_add_(0, slot, torch.where(kept, values, 0).reshape(-1).to(values.dtype))
    return out[:samples]


def per_token(per_sample: torch.Tensor, sample_ids: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
    """``[rows, width]``: each position holds its sample's value; padding holds ``fill``."""
    if per_sample.numel() == 0:
        return torch.full(sample_ids.shape, fill, dtype=per_sample.dtype, device=sample_ids.device)
    return torch.where(sample_ids >= 0, per_sample[sample_ids.clamp(min=0)], fill)
