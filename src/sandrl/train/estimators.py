"""Policy-gradient estimators: how one token's loss follows from its log-prob, advantage and ratio.

``[train.loss] estimator`` picks one; each returns the per-token loss before importance weights
and aggregation (:func:`sandrl.train.losses.policy_loss` applies those). All tensors are
``[rows, width]``; ``old`` is the proximal log-prob (detached), ``keep`` the loss mask as
booleans, and positions outside it are zeroed before any ``exp`` so that whatever they hold can
neither overflow nor reach a gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sandrl.train.per_sample import per_sample_sum, per_token


@dataclass(frozen=True)
class TokenObjective:
    """The per-token policy loss of a micro-batch and how many tokens its clipping touched."""

    loss: torch.Tensor
    """``[rows, width]``: minimised; the gradient flows through it."""
    clipped_low: int
    """Tokens clipped below ``1 - epsilon_low``."""
    clipped_high: int
    """Tokens clipped above ``1 + epsilon_high``."""


@dataclass(frozen=True)
class TokenInputs:
    """What every estimator is given: each token's log-prob (with its gradient), its proximal
    log-prob, its advantage and whether it counts; and the clip range ``[1 - eps_low, 1 + eps_high]``."""

    logprobs: torch.Tensor
    old: torch.Tensor
    advantages: torch.Tensor
    keep: torch.Tensor
    epsilon_low: float
    epsilon_high: float


def ppo_clip(x: TokenInputs) -> TokenObjective:
    """PPO's clipped surrogate on each token's ratio ``r = exp(logp - old)`` (Schulman et al. 2017,
    arXiv:1707.06347), as GRPO uses it (Shao et al. 2024, arXiv:2402.03300):
    ``-min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)``. A token whose ratio left the range in the
    direction its advantage pushes gets no gradient."""
    ratio = torch.exp(torch.where(x.keep, x.logprobs - x.old, 0.0))
    return _clipped(ratio, ratio, x)


def gspo(x: TokenInputs, *, sample_ids: torch.Tensor, samples: int) -> TokenObjective:
    """GSPO (Zheng et al. 2025, *Group Sequence Policy Optimization*, arXiv:2507.18071): one ratio per
    sample, the geometric mean of its token ratios ``s = exp(mean_t(logp - old))`` over its model
    tokens, clipped at the sequence level, so a whole sample is kept or clipped.

    In the GSPO-token form: each token carries ``s_t = sg[s] * exp(logp_t - sg[logp_t])``, whose
    value is ``s`` and whose gradient is its own log-prob's, so per-token advantages work and the
    gradient of ``-min(s_t A, clip(s_t) A)`` averaged over the sample's tokens is GSPO's. The clip
    range applies to ``s``, which is close to 1 (the paper uses 3e-4 and 4e-4); a clipped sample
    counts all its tokens as clipped.
    """
    delta = torch.where(x.keep, x.logprobs - x.old, 0.0).detach()
    tokens = per_sample_sum(torch.ones_like(delta), sample_ids, x.keep, samples)
    mean_log_ratio = per_sample_sum(delta, sample_ids, x.keep, samples) / tokens.clamp(min=1)
    own = torch.where(x.keep, x.logprobs - x.logprobs.detach(), 0.0)  # value 0, gradient of logp
    ratio = torch.exp(per_token(mean_log_ratio, sample_ids) + own)
    return _clipped(ratio, ratio.detach(), x)


def cispo(x: TokenInputs) -> TokenObjective:
    """CISPO (MiniMax 2025, *MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning
    Attention*, arXiv:2506.13585): clip the importance weight instead of the update, and never drop
    a token: ``-sg[clip(r, 1 - eps_low, 1 + eps_high)] * A * logp``.

    PPO's clip zeroes the gradient of a token whose ratio left the range, and the rare tokens that
    open a new line of reasoning ("However", "Wait") are the ones that leave it; CISPO keeps their
    gradient, bounded by the clipped weight. Written as ``-sg[w] * A * exp(logp - sg[logp])``: the
    same gradient as the paper's ``logp`` form, with a value (``-w A``) comparable with PPO's. Every
    token whose weight was clamped is counted, whatever its advantage's sign. MiniMax-M1 bounds the
    weight only above (set ``epsilon_low`` near 1 for that).
    """
    log_ratio = torch.where(x.keep, x.logprobs - x.old, 0.0)
    ratio = torch.exp(log_ratio.detach())
    weight = ratio.clamp(1 - x.epsilon_low, 1 + x.epsilon_high)
    loss = -weight * x.advantages * torch.exp(log_ratio - log_ratio.detach())
    with torch.no_grad():
        clipped_low = int((x.keep & (ratio < 1 - x.epsilon_low)).sum())
        clipped_high = int((x.keep & (ratio > 1 + x.epsilon_high)).sum())
    return TokenObjective(loss, clipped_low, clipped_high)


def _clipped(ratio: torch.Tensor, value: torch.Tensor, x: TokenInputs) -> TokenObjective:
    """``-min(ratio A, clip(ratio) A)``, with the tokens whose ``value`` was clipped against their advantage counted."""
    clipped_ratio = ratio.clamp(1 - x.epsilon_low, 1 + x.epsilon_high)
    loss = -torch.minimum(ratio * x.advantages, clipped_ratio * x.advantages)
    with torch.no_grad():
        clipped_low = int((x.keep & (x.advantages < 0) & (value < 1 - x.epsilon_low)).sum())
        clipped_high = int((x.keep & (x.advantages > 0) & (value > 1 + x.epsilon_high)).sum())
    return TokenObjective(loss, clipped_low, clipped_high)
