"""The GRPO family of policy losses, and the supervised loss the demo warm-starts with.

Every option names the paper it comes from, so a user chooses knowingly (as TRL's
``GRPOConfig`` does). All tensors are ``[batch, tokens]`` and aligned with the tokens of
the conversation: position ``t`` holds ``log p(token_t | tokens_<t)``; a 0 in the loss mask
(the prompt, observations, padding) removes the position from every sum and mean.

The policy loss of one token, minimised, is

.. code-block:: text

    r     = exp(logp - logp_old)                               # the PPO ratio
    pg    = -min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A)
    w_is  = min(exp(logp_old - logp_rollout), tis_cap)          # truncated importance sampling
    loss  = w_is * pg + beta * KL_k3(logp, logp_ref)

and the tokens are aggregated as ``loss_type`` says. ``logp_old`` is the trainer's own
log-prob before this step's first update (the *proximal* policy of decoupled PPO), and
``logp_rollout`` is what the inference server reported when it sampled the token, so ``w_is``
corrects for both a stale policy (asynchronous training) and numeric differences between the
inference engine and the trainer.

References:

- GRPO: Shao et al. 2024, *DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open
  Language Models*, arXiv:2402.03300.
- PPO clipping: Schulman et al. 2017, *Proximal Policy Optimization Algorithms*, arXiv:1707.06347.
- Dr. GRPO: Liu et al. 2025, *Understanding R1-Zero-Like Training: A Critical Perspective*, arXiv:2503.20783.
- DAPO: Yu et al. 2025, *DAPO: An Open-Source LLM Reinforcement Learning System at Scale*, arXiv:2503.14476.
- Batch-level reward scaling: Liu et al. 2025, *Part I: Tricks or Traps? A Deep Dive into RL for LLM
  Reasoning*, arXiv:2508.08221.
- The k3 KL estimator: Schulman 2020, *Approximating KL Divergence*, http://joschu.net/blog/kl-approx.html.
- Truncated importance sampling: Yao et al. 2025, *Your Efficient RL Framework Secretly Brings You
  Off-Policy RL Training*, https://fengyao.notion.site/off-policy-rl; the proximal/behaviour split is
  decoupled PPO (Hilton et al. 2021, *Batch size-invariance for policy optimization*, arXiv:2110.00641).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from sandrl.errors import ConfigError

LossType = Literal["grpo", "dr_grpo", "dapo"]
ScaleRewards = Literal["group", "batch", "none"]


@dataclass(frozen=True)
class LossConfig:
    """The policy loss: its aggregation, clipping, reward scaling, KL and importance correction."""

    loss_type: LossType = "grpo"
    """How token losses become the batch loss.

    - ``grpo``: the mean over each sample's model tokens, then the mean over samples (GRPO,
      arXiv:2402.03300). Long answers weigh less per token, which Dr. GRPO shows biases the
      policy towards long wrong answers.
    - ``dr_grpo``: the sum over tokens divided by ``samples * max_tokens``, a constant, so no
      length bias (Dr. GRPO, arXiv:2503.20783).
    - ``dapo``: the sum over all model tokens of the batch divided by their number: every token
      weighs the same (DAPO's token-level policy gradient loss, arXiv:2503.14476).
    """
    epsilon_low: float = 0.2
    """Lower clip range: the ratio is clipped below at ``1 - epsilon_low`` (PPO, arXiv:1707.06347)."""
    epsilon_high: float = 0.2
    """Upper clip range: the ratio is clipped above at ``1 + epsilon_high``. DAPO's *clip-higher*
    raises it to 0.28 so that unlikely tokens can gain probability and entropy does not collapse
    (arXiv:2503.14476). Clipping only acts when a batch is split into several updates
    (``TrainConfig.minibatches > 1``) or the proximal policy differs from the current one."""
    scale_rewards: ScaleRewards = "group"
    """How group-centred rewards are scaled into advantages ``A = (r - mean_group) / scale``.

    - ``group``: by the standard deviation of the group (GRPO, arXiv:2402.03300).
    - ``batch``: by the standard deviation of all rewards in the batch (arXiv:2508.08221, which finds
      it more robust than the per-group one).
    - ``none``: not at all; Dr. GRPO shows the per-group std over-weights groups that are nearly all
      right or all wrong (arXiv:2503.20783).
    """
    max_tokens: int | None = None
    """Dr. GRPO's constant: the model-token budget of one sample. None: the most model tokens of any
    sample in the batch. Only ``loss_type = "dr_grpo"`` reads it."""
    beta: float = 0.0
    """Weight of the KL penalty to the reference (initial) policy, estimated per token with Schulman's
    k3 estimator as in GRPO (arXiv:2402.03300). 0 disables it and the trainer keeps no reference model
    (as DAPO and Dr. GRPO recommend for verifiable rewards)."""
    tis_cap: float | None = 2.0
    """Truncated importance sampling: each token's loss is multiplied by
    ``min(p_trainer / p_rollout, tis_cap)``, which corrects for a stale rollout policy and for
    inference/trainer numeric mismatch while bounding the variance (Yao et al. 2025,
    https://fengyao.notion.site/off-policy-rl). None disables it; the samples then need no
    rollout log-probs."""
    advantage_epsilon: float = 1e-4
    """Added to the standard deviation before dividing, so a near-constant group stays finite."""

    def __post_init__(self) -> None:
        if self.loss_type not in ("grpo", "dr_grpo", "dapo"):
            raise ConfigError(f"loss_type must be 'grpo', 'dr_grpo' or 'dapo', got {self.loss_type!r}")
        if self.scale_rewards not in ("group", "batch", "none"):
            raise ConfigError(f"scale_rewards must be 'group', 'batch' or 'none', got {self.scale_rewards!r}")
        for name in ("epsilon_low", "epsilon_high"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ConfigError(f"{name} must be a finite number >= 0 (0.2 is usual), got {value!r}")
        if self.epsilon_low >= 1:
            raise ConfigError(
                f"epsilon_low must be < 1 (the ratio is clipped at 1 - epsilon_low), got {self.epsilon_low}"
            )
        if not math.isfinite(self.beta) or self.beta < 0:
            raise ConfigError(f"beta (the KL weight) must be a finite number >= 0, got {self.beta!r}")
        if self.tis_cap is not None and (not math.isfinite(self.tis_cap) or self.tis_cap < 1):
            raise ConfigError(
                f"tis_cap must be a number >= 1 (2 is usual), or absent to disable importance sampling; "
                f"got {self.tis_cap!r}"
            )
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be >= 1, or absent to use the longest sample; got {self.max_tokens}")
        if not math.isfinite(self.advantage_epsilon) or self.advantage_epsilon < 0:
            raise ConfigError(f"advantage_epsilon must be a finite number >= 0, got {self.advantage_epsilon!r}")


@dataclass(frozen=True)
class LossOutput:
    """A loss to back-propagate and the sums behind its metrics (sums, so micro-batches add up)."""

    loss: torch.Tensor
    """A scalar: the weighted sum of the token losses."""
    tokens: int
    """Model tokens that entered the loss."""
    clipped_low: int
    """Tokens whose ratio was clipped below (negative advantage, ratio < 1 - epsilon_low)."""
    clipped_high: int
    """Tokens whose ratio was clipped above (positive advantage, ratio > 1 + epsilon_high)."""
    is_weight_sum: float
    """Sum of the importance weights over the tokens (1 per token without correction)."""
    is_truncated: int
    """Tokens whose importance weight hit ``tis_cap``."""
    kl_sum: float
    """Sum of the k3 KL estimates over the tokens (0 without a reference)."""


def group_advantages(
    groups: Sequence[Sequence[float]], scale: ScaleRewards = "group", epsilon: float = 1e-4
) -> list[list[float]]:
    """GRPO's advantages: each reward minus its group's mean, divided as ``scale`` says (see :class:`LossConfig`).

    The standard deviation is the unbiased one (Bessel's correction), as in TRL; a group of one
    sample has no spread and gets advantage 0.
    """
    out: list[list[float]] = []
    batch = [r for group in groups for r in group]
    batch_std = _std(batch)
    for group in groups:
        if not group:
            out.append([])
            continue
        mean = sum(group) / len(group)
        if scale == "group":
            denom = _std(group) + epsilon
        elif scale == "batch":
            denom = batch_std + epsilon
        else:
            denom = 1.0
        out.append([(r - mean) / denom for r in group])
    return out


def has_signal(rewards: Sequence[float]) -> bool:
    """Whether a group's rewards differ: a group whose samples all scored the same has zero advantage
    everywhere and teaches nothing (DAPO's *dynamic sampling* filters such groups, arXiv:2503.14476)."""
    return len(rewards) > 1 and max(rewards) != min(rewards)


def token_weights(mask: torch.Tensor, config: LossConfig, *, samples: int | None = None) -> torch.Tensor:
    """The weight of each token in the batch loss, so that ``loss = sum(weights * token_loss)``.

    ``mask`` is the ``[batch, tokens]`` loss mask of the *whole* batch (every micro-batch of one
    update), so splitting it into micro-batches later changes nothing. ``samples`` is the number
    of samples to average over (the rows of ``mask`` by default).
    """
    mask = mask.to(torch.float32)
    rows = mask.shape[0] if samples is None else samples
    if rows == 0:
        return mask
    lengths = mask.sum(dim=-1, keepdim=True)
    if config.loss_type == "grpo":
        return mask / (lengths.clamp(min=1) * rows)
    if config.loss_type == "dr_grpo":
        budget = config.max_tokens if config.max_tokens is not None else max(int(lengths.max()), 1)
        return mask / (rows * budget)
    return mask / max(float(mask.sum()), 1.0)


def importance_weights(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance weights ``min(exp(old - rollout), cap)``: exactly 1 where the two agree."""
    return torch.exp(old_logprobs - rollout_logprobs).clamp(max=cap)


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimate of KL(policy || reference) per token: ``exp(ref - p) - (ref - p) - 1`` (>= 0)."""
    delta = ref_logprobs - logprobs
    return torch.exp(delta) - delta - 1


def policy_loss(
    logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: LossConfig,
    *,
    old_logprobs: torch.Tensor | None = None,
    rollout_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
) -> LossOutput:
    """The clipped, importance-corrected GRPO loss of a ``[batch, tokens]`` micro-batch (see the module docstring).

    ``advantages`` is ``[batch]`` or per token, ``[batch, tokens]``. ``old_logprobs`` defaults to
    ``logprobs`` detached (one update per batch, the ratio is 1 but carries the gradient).
    ``rollout_logprobs`` is needed when ``config.tis_cap`` is set, ``ref_logprobs`` when
    ``config.beta > 0``. ``weights`` are from :func:`token_weights` over the whole batch; by
    default this micro-batch is the whole batch.
    """
    keep = mask.to(torch.bool)
    old = logprobs.detach() if old_logprobs is None else old_logprobs.detach()
    if weights is None:
        weights = token_weights(mask, config)
    adv = advantages.to(logprobs.dtype)
    if adv.dim() < logprobs.dim():  # one advantage per sample: every token of it carries it
        adv = adv.unsqueeze(-1)
    # Masked positions are zeroed before exp, so garbage there (a 0 placeholder, a huge number)
    # can neither overflow nor leak into the sums.
    ratio = torch.exp(torch.where(keep, logprobs - old, 0.0))
    clipped_ratio = ratio.clamp(1 - config.epsilon_low, 1 + config.epsilon_high)
    pg = -torch.minimum(ratio * adv, clipped_ratio * adv)
    with torch.no_grad():
        clipped_low = int((keep & (adv < 0) & (ratio < 1 - config.epsilon_low)).sum())
        clipped_high = int((keep & (adv > 0) & (ratio > 1 + config.epsilon_high)).sum())
    if config.tis_cap is not None:
        if rollout_logprobs is None:
            raise ConfigError("importance sampling needs the rollout log-probs; pass them, or set tis_cap to None")
        is_w = importance_weights(torch.where(keep, old, 0.0), torch.where(keep, rollout_logprobs, 0.0), config.tis_cap)
        pg = pg * is_w.detach()
        is_weight_sum = float(is_w[keep].sum())
        is_truncated = int((keep & (is_w >= config.tis_cap)).sum())
    else:
        is_weight_sum, is_truncated = float(keep.sum()), 0
    per_token = pg
    kl_sum = 0.0
    if config.beta > 0:
        if ref_logprobs is None:
            raise ConfigError("a KL penalty (beta > 0) needs the reference model's log-probs")
        kl = kl_k3(logprobs, torch.where(keep, ref_logprobs, logprobs.detach()))
        per_token = per_token + config.beta * kl
        kl_sum = float(kl.detach()[keep].sum())
    loss = torch.where(keep, per_token * weights, 0.0).sum()
    return LossOutput(
        loss=loss,
        tokens=int(keep.sum()),
        clipped_low=clipped_low,
        clipped_high=clipped_high,
        is_weight_sum=is_weight_sum,
        is_truncated=is_truncated,
        kl_sum=kl_sum,
    )


def sft_loss(logprobs: torch.Tensor, mask: torch.Tensor, *, total_tokens: int | None = None) -> torch.Tensor:
    """Masked cross-entropy: minus the mean log-prob of the model tokens (``total_tokens`` of the whole batch)."""
    keep = mask.to(torch.bool)
    count = int(keep.sum()) if total_tokens is None else total_tokens
    return -torch.where(keep, logprobs, 0.0).sum() / max(count, 1)


def _std(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
