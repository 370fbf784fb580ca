"""Advantages from rewards: GRPO's group baseline, RLOO's leave-one-out one, REINFORCE++'s batch one.

``[train.loss] advantage`` picks the estimator. Each takes the rewards of a batch as groups (the
samples of one task) and gives one advantage per sample; every model token of a sample carries
it. Standard deviations are the unbiased ones (Bessel's correction), as in TRL.

References:

- GRPO: Shao et al. 2024, *DeepSeekMath*, arXiv:2402.03300; batch-level scaling: Liu et al. 2025,
  *Part I: Tricks or Traps? A Deep Dive into RL for LLM Reasoning*, arXiv:2508.08221; no scaling:
  Liu et al. 2025, *Understanding R1-Zero-Like Training* (Dr. GRPO), arXiv:2503.20783.
- RLOO: Ahmadian et al. 2024, *Back to Basics: Revisiting REINFORCE Style Optimization for Learning
  from Human Feedback in LLMs*, arXiv:2402.14740 (after Kool et al. 2019, *Buy 4 REINFORCE Samples,
  Get a Baseline for Free!*).
- REINFORCE++: Hu 2025, *REINFORCE++: A Simple and Efficient Approach for Aligning Large Language
  Models*, arXiv:2501.03262.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from sandrl.errors import TrainError
from sandrl.train.loss_config import Advantage, ScaleRewards


def advantages(
    groups: Sequence[Sequence[float]],
    estimator: Advantage = "grpo",
    *,
    scale: ScaleRewards = "group",
    epsilon: float = 1e-4,
    tokens: Sequence[Sequence[int]] | None = None,
) -> list[list[float]]:
    """The advantages ``estimator`` gives the rewards ``groups`` (see :class:`~sandrl.train.losses.LossConfig`).

    ``scale`` is read by ``grpo`` and ``rloo``; ``tokens`` (each sample's model tokens, aligned with
    ``groups``) weighs the REINFORCE++ statistics per token (each sample once without it).
    """
    if estimator == "grpo":
        return group_advantages(groups, scale, epsilon)
    if estimator == "rloo":
        return _scaled(rloo_advantages(groups), groups, scale, epsilon)
    if estimator == "reinforce_pp":
        return reinforce_pp_advantages(groups, tokens=tokens, epsilon=epsilon)
    return reinforce_pp_baseline_advantages(groups, tokens=tokens, epsilon=epsilon)


def group_advantages(
    groups: Sequence[Sequence[float]], scale: ScaleRewards = "group", epsilon: float = 1e-4
) -> list[list[float]]:
    """GRPO's advantages: each reward minus its group's mean, divided as ``scale`` says.

    ``group``: by the group's standard deviation (GRPO); ``batch``: by the standard deviation of all
    the rewards (arXiv:2508.08221); ``none``: not divided (Dr. GRPO). A group of one sample has no
    spread and gets advantage 0.
    """
    centred = [[r - sum(group) / len(group) for r in group] for group in groups]
    return _scaled(centred, groups, scale, epsilon)


def rloo_advantages(groups: Sequence[Sequence[float]]) -> list[list[float]]:
    """RLOO's advantages (arXiv:2402.14740): each reward minus the mean of the *other* rewards of its group.

    The baseline leaves the sample out, so it does not depend on the sample's own reward and the
    gradient estimate is unbiased; it equals ``G / (G - 1)`` times GRPO's centred reward. A group
    of one has no other sample: advantage 0.
    """
    out: list[list[float]] = []
    for group in groups:
        n, total = len(group), sum(group)
        out.append([r - (total - r) / (n - 1) if n > 1 else 0.0 for r in group])
    return out


def reinforce_pp_advantages(
    groups: Sequence[Sequence[float]], *, tokens: Sequence[Sequence[int]] | None = None, epsilon: float = 1e-4
) -> list[list[float]]:
    """REINFORCE++ (arXiv:2501.03262): global-batch normalisation, ``(r - mean_batch) / (std_batch + epsilon)``.

    No per-prompt baseline: the whole batch's mean is the baseline and its spread the scale, which
    the paper finds more stable than a group's on small groups and less prone to overfit easy
    prompts. With ``tokens``, mean and spread are over every model token of the batch (each sample
    counted once per token, as OpenRLHF's and verl's whitening does); else over the samples.
    """
    flat = [r for group in groups for r in group]
    mean, std = _weighted_stats(flat, _flat_weights(groups, tokens))
    return [[(r - mean) / (std + epsilon) for r in group] for group in groups]


def reinforce_pp_baseline_advantages(
    groups: Sequence[Sequence[float]], *, tokens: Sequence[Sequence[int]] | None = None, epsilon: float = 1e-4
) -> list[list[float]]:
    """REINFORCE++-baseline (arXiv:2501.03262): the group's mean subtracted, then the batch normalised.

    The group mean removes each prompt's difficulty (as GRPO's); dividing by the spread of the
    centred rewards over the whole batch, not the group's, keeps a nearly unanimous group from
    being blown up. Statistics are weighted per token with ``tokens``, as in
    :func:`reinforce_pp_advantages`.
    """
    centred = [[r - sum(group) / len(group) for r in group] for group in groups]
    flat = [c for group in centred for c in group]
    mean, std = _weighted_stats(flat, _flat_weights(groups, tokens))
    return [[(c - mean) / (std + epsilon) for c in group] for group in centred]


def has_signal(rewards: Sequence[float]) -> bool:
    """Whether a group's rewards differ: a group whose samples all scored the same has zero advantage
    everywhere and teaches nothing (DAPO's *dynamic sampling* filters such groups, arXiv:2503.14476)."""
    return len(rewards) > 1 and max(rewards) != min(rewards)


def _scaled(
    centred: list[list[float]], groups: Sequence[Sequence[float]], scale: ScaleRewards, epsilon: float
) -> list[list[float]]:
    """``centred`` divided by the spread of the group's rewards, of the batch's, or by nothing."""
    if scale == "none":
        return centred
    batch_std = _std([r for group in groups for r in group])
    out: list[list[float]] = []
    for values, group in zip(centred, groups, strict=True):
        denom = (_std(group) if scale == "group" else batch_std) + epsilon
        out.append([v / denom for v in values])
    return out


def _flat_weights(groups: Sequence[Sequence[float]], tokens: Sequence[Sequence[int]] | None) -> list[float]:
    if tokens is None:
        return [1.0 for group in groups for _ in group]
    if [len(g) for g in tokens] != [len(g) for g in groups]:
        raise TrainError("tokens must give one count per reward, group by group")
    return [float(n) for group in tokens for n in group]


def _weighted_stats(values: Sequence[float], weights: Sequence[float]) -> tuple[float, float]:
    """Weighted mean and unbiased standard deviation (``weights`` are frequencies: tokens)."""
    total = sum(weights)
    if total <= 0:
        return 0.0, 0.0
    mean = sum(w * v for v, w in zip(values, weights, strict=True)) / total
    if total <= 1:
        return mean, 0.0
    return mean, math.sqrt(sum(w * (v - mean) ** 2 for v, w in zip(values, weights, strict=True)) / (total - 1))


def _std(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
