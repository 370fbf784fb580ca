"""Importance sampling between the engine that sampled the tokens and the trainer: ``[train.loss.is]``.

A token was sampled by the inference engine with log-prob ``rollout``; the trainer's proximal
policy (its own log-prob before this step's first update, ``old``) gives it ``old``. The two
differ when the samples are stale (asynchronous training) and because the engine and the
trainer compute differently (kernels, precision, batch shapes). The ratio ``exp(old - rollout)``
re-weights each token's loss so the gradient is the trainer's policy's; it is measured at one of
three levels:

- ``token``: each token's own ratio (truncated importance sampling, TIS: Yao et al. 2025,
  *Your Efficient RL Framework Secretly Brings You Off-Policy RL Training*,
  https://fengyao.notion.site/off-policy-rl).
- ``sequence``: the product of a sample's token ratios, ``exp(sum(old - rollout))``: the exact
  ratio of the sequence's probabilities, one weight for all its tokens.
- ``geometric``: their geometric mean, ``exp(mean(old - rollout))``: length-normalised, so a long
  sample's weight stays near 1 (as GSPO normalises its ratio, Zheng et al. 2025, arXiv:2507.18071).

and used in one of two modes, against ``band = [low, high]``:

- ``truncate``: the weight is clamped into the band (``min(w, high)``, and ``max(w, low)`` when
  ``low > 0``), which bounds the variance and keeps every token (TIS).
- ``mask``: a token (token level) or a whole sample (sequence and geometric levels) whose ratio
  leaves the band is dropped: its weight is 0; the others keep their ratio as weight (masked
  importance sampling, MIS: Liu et al. 2025, *When Speed Kills Stability: Demystifying RL Collapse
  from the Training-Inference Mismatch*; IcePop: Ling Team 2025, the Ring-1T report; Miles' and
  slime's ``train_infer_mismatch_helper``). A masked token keeps its place in the loss's normaliser,
  as a token of weight 0 (IcePop's form): :func:`~sandrl.train.losses.token_weights` is fixed for
  the whole minibatch before the forward that gives the ratios, so that the split into
  micro-batches changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sandrl.train.loss_config import ImportanceConfig
from sandrl.train.per_sample import per_sample_sum, per_token


@dataclass(frozen=True)
class Correction:
    """The importance weights of a micro-batch and what they did (sums, so micro-batches add up)."""

    weights: torch.Tensor
    """``[rows, width]``, detached: what each token's policy loss is multiplied by (0 where masked)."""
    weight_sum: float
    """Sum of the weights over the model tokens (masked ones add 0)."""
    truncated: int
    """Model tokens whose weight was clamped to the band (every token of a clamped sample)."""
    masked_tokens: int
    """Model tokens dropped for a ratio outside the band (every token of a dropped sample)."""
    masked_sequences: int
    """Samples dropped whole (``sequence`` and ``geometric`` levels; 0 at the token level)."""


def correction(
    old: torch.Tensor,
    rollout: torch.Tensor,
    keep: torch.Tensor,
    config: ImportanceConfig,
    *,
    sample_ids: torch.Tensor,
    samples: int,
) -> Correction:
    """The importance weights ``config`` asks for, from the proximal and the rollout log-probs (``[rows, width]``).

    ``keep`` is the loss mask as booleans; ``sample_ids`` says which sample each position belongs to
    (see :mod:`sandrl.train.per_sample`) and ``samples`` how many there are.
    """
    low, high = config.band
    # Masked positions are zeroed before exp, so whatever they hold can neither overflow nor leak.
    log_ratio = torch.where(keep, old.detach(), 0.0) - torch.where(keep, rollout.detach(), 0.0)
    if config.level == "token":
        ratio = torch.exp(log_ratio)
        sequence_out = None
    else:
        total = per_sample_sum(log_ratio, sample_ids, keep, samples)
        if config.level == "geometric":
            total = total / per_sample_sum(torch.ones_like(log_ratio), sample_ids, keep, samples).clamp(min=1)
        # exp of a long sample's sum may overflow to inf: clamping or comparing inf is still exact.
        seq_ratio = torch.exp(total)
        sequence_out = (seq_ratio < low) | (seq_ratio > high)
        ratio = per_token(seq_ratio, sample_ids, fill=1.0)
    if config.mode == "truncate":
        weights = ratio.clamp(max=high)
        hit = weights >= high
        if low > 0:
            weights = weights.clamp(min=low)
            hit = hit | (weights <= low)
        truncated, dropped, masked_sequences = int((keep & hit).sum()), 0, 0
    else:
        outside = (ratio < low) | (ratio > high)
        weights = torch.where(outside, 0.0, ratio)
        truncated, dropped = 0, int((keep & outside).sum())
        masked_sequences = 0 if sequence_out is None else int(_has_tokens(sequence_out, sample_ids, keep, samples))
    return Correction(
        weights=weights,
        weight_sum=float(weights[keep].sum()),
        truncated=truncated,
        masked_tokens=dropped,
        masked_sequences=masked_sequences,
    )


def _has_tokens(chosen: torch.Tensor, sample_ids: torch.Tensor, keep: torch.Tensor, samples: int) -> torch.Tensor:
    """How many of the ``chosen`` samples have at least one model token."""
    tokens = per_sample_sum(torch.ones(sample_ids.shape, device=keep.device), sample_ids, keep, samples)
    return (chosen & (tokens > 0)).sum()
