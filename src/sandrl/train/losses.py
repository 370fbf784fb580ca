"""The policy losses of the GRPO family, and the supervised loss the demo warm-starts with.

Every option names the paper it comes from, so a user chooses knowingly (as TRL's
``GRPOConfig`` does; ``docs/guide/learning-signal.md`` explains when to use which). All tensors
are ``[rows, tokens]`` and aligned with the tokens of the conversation: position ``t`` holds
``log p(token_t | tokens_<t)``; a 0 in the loss mask (the prompt, observations, padding) removes
the position from every sum and mean. A row may hold several samples end to end (packing):
``sample_ids`` says which (:mod:`sandrl.train.per_sample`).

The loss of one token, minimised, is

.. code-block:: text

    pg    = the estimator's token loss                          # estimator: ppo, gspo, cispo
          = -min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A),  r = exp(logp - logp_old)   (ppo)
    w_is  = the importance weight of exp(logp_old - logp_rollout)  # [train.loss.is], or tis_cap
    loss  = w_is * pg + beta * KL_k3(logp, logp_ref)

and the tokens are aggregated as ``loss_type`` says. ``A`` comes from the rewards as
``advantage`` says (:mod:`sandrl.train.advantages`). ``logp_old`` is the trainer's own log-prob
before this step's first update (the *proximal* policy of decoupled PPO), and ``logp_rollout``
is what the inference server reported when it sampled the token, so ``w_is`` corrects for both a
stale policy (asynchronous training) and numeric differences between the inference engine and the
trainer (:mod:`sandrl.train.importance`). The estimators are in :mod:`sandrl.train.estimators`, the
settings (:class:`~sandrl.train.loss_config.LossConfig`) in :mod:`sandrl.train.loss_config`.

References:

- GRPO: Shao et al. 2024, *DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open
  Language Models*, arXiv:2402.03300.
- PPO clipping: Schulman et al. 2017, *Proximal Policy Optimization Algorithms*, arXiv:1707.06347.
- GSPO: Zheng et al. 2025, *Group Sequence Policy Optimization*, arXiv:2507.18071.
- CISPO: MiniMax 2025, *MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention*,
  arXiv:2506.13585.
- Dr. GRPO: Liu et al. 2025, *Understanding R1-Zero-Like Training: A Critical Perspective*, arXiv:2503.20783.
- DAPO: Yu et al. 2025, *DAPO: An Open-Source LLM Reinforcement Learning System at Scale*, arXiv:2503.14476.
- RLOO: Ahmadian et al. 2024, *Back to Basics: Revisiting REINFORCE Style Optimization for Learning from
  Human Feedback in LLMs*, arXiv:2402.14740.
- REINFORCE++: Hu 2025, *REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models*,
  arXiv:2501.03262.
- Batch-level reward scaling: Liu et al. 2025, *Part I: Tricks or Traps? A Deep Dive into RL for LLM
  Reasoning*, arXiv:2508.08221.
- The k3 KL estimator: Schulman 2020, *Approximating KL Divergence*, http://joschu.net/blog/kl-approx.html.
- Truncated importance sampling: Yao et al. 2025, *Your Efficient RL Framework Secretly Brings You
  Off-Policy RL Training*, https://fengyao.notion.site/off-policy-rl; the proximal/behaviour split is
  decoupled PPO (Hilton et al. 2021, *Batch size-invariance for policy optimization*, arXiv:2110.00641).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sandrl.errors import ConfigError
from sandrl.train import estimators
from sandrl.train.importance import correction
from sandrl.train.loss_config import LossConfig, LossType, ScaleRewards
from sandrl.train.per_sample import per_sample_sum, per_token, row_sample_ids, sample_count

# The settings live in loss_config (read without PyTorch); these names stay importable from here.
__all__ = [
    "LossConfig",
    "LossOutput",
    "LossType",
    "ScaleRewards",
    "importance_weights",
    "kl_k3",
    "policy_loss",
    "sft_loss",
    "token_weights",
]


@dataclass(frozen=True)
class LossOutput:
    """A loss to back-propagate and the sums behind its metrics (sums, so micro-batches add up)."""

    loss: torch.Tensor
    """A scalar: the weighted sum of the token losses."""
    tokens: int
    """Model tokens of the micro-batch (masked ones included)."""
    clipped_low: int
    """Tokens whose ratio was clipped below (PPO, GSPO: negative advantage, ratio < 1 - epsilon_low;
    CISPO: any advantage)."""
    clipped_high: int
    """Tokens whose ratio was clipped above (PPO, GSPO: positive advantage, ratio > 1 + epsilon_high;
    CISPO: any advantage)."""
    is_weight_sum: float
    """Sum of the importance weights over the tokens (1 per token without correction, 0 per masked one)."""
    is_truncated: int
    """Tokens whose importance weight was clamped to the band (``tis_cap``)."""
    kl_sum: float
    """Sum of the k3 KL estimates over the tokens (0 without a reference)."""
    is_masked_tokens: int = 0
    """Tokens that importance masking (``[train.loss.is] mode = "mask"``) dropped from the loss."""
    is_masked_sequences: int = 0
    """Samples that sequence- or geometric-level masking dropped whole."""
    mismatch_kl_sum: float = 0.0
    """Sum over the tokens of the k3 estimate of KL(engine || trainer), ``exp(d) - d - 1`` with
    ``d = logp_old - logp_rollout``: how far the sampling engine's distribution is from the trainer's
    proximal one on the tokens it sampled (>= 0; 0 without rollout log-probs)."""
    mismatch_tokens: int = 0
    """Tokens ``mismatch_kl_sum`` is over (0 without rollout log-probs)."""


def token_weights(
    mask: torch.Tensor, config: LossConfig, *, samples: int | None = None, sample_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """The weight of each token in the batch loss, so that ``loss = sum(weights * token_loss)``.

    ``mask`` is the ``[rows, tokens]`` loss mask of the *whole* batch (every micro-batch of one
    update), so splitting it into micro-batches later changes nothing. ``samples`` is the number
    of samples to average over (the rows of ``mask``, or the samples ``sample_ids`` names, by default);
    ``sample_ids`` is for rows that hold several samples.
    """
    mask = mask.to(torch.float32)
    if sample_ids is not None:
        return _packed_token_weights(mask, config, sample_ids, samples)
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


def _packed_token_weights(
    mask: torch.Tensor, config: LossConfig, sample_ids: torch.Tensor, samples: int | None
) -> torch.Tensor:
    count = sample_count(sample_ids)
    rows = count if samples is None else samples
    if rows == 0:
        return mask
    lengths = per_sample_sum(mask, sample_ids, mask > 0, count)
    if config.loss_type == "grpo":
        return mask / (per_token(lengths, sample_ids, fill=1.0).clamp(min=1) * rows)
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
    # expm1: for the tiny deltas of two nearly equal policies, exp(d) - 1 - d in float32 is rounding
    # noise of either sign (-7e-9 where the engine and the trainer agree); expm1(d) - d is ~d^2 / 2.
    return torch.expm1(delta) - delta


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
    sample_ids: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> LossOutput:
    """The policy loss of a ``[rows, tokens]`` micro-batch (see the module docstring).

    ``advantages`` is ``[rows]`` (one sample a row) or per token, ``[rows, tokens]``. ``old_logprobs``
    defaults to ``logprobs`` detached (one update per batch, the ratio is 1 but carries the gradient).
    ``rollout_logprobs`` is needed when importance sampling is on, ``ref_logprobs`` when
    ``config.beta > 0``; pass None for rollout log-probs the samples do not have (the mismatch KL is
    then 0). ``weights`` are from :func:`token_weights` over the whole batch; by default this
    micro-batch is the whole batch. ``sample_ids`` (``[rows, tokens]``, -1 on padding) says which
    sample each position belongs to when a row holds several (packing); None: each row is one.
    ``entropy`` (per token, with its gradient) is needed when ``config.entropy_coef > 0``.
    """
    keep = mask.to(torch.bool)
    old = logprobs.detach() if old_logprobs is None else old_logprobs.detach()
    if weights is None:
        weights = token_weights(mask, config, sample_ids=sample_ids)
    adv = advantages.to(logprobs.dtype)
    if adv.dim() < logprobs.dim():  # one advantage per sample: every token of it carries it
        adv = adv.unsqueeze(-1)
    sampling = config.importance_sampling
    per_sample = config.estimator == "gspo" or (sampling is not None and sampling.level != "token")
    ids = row_sample_ids(logprobs.shape, logprobs.device) if sample_ids is None else sample_ids
    samples = sample_count(ids) if per_sample else 0
    inputs = estimators.TokenInputs(logprobs, old, adv, keep, config.epsilon_low, config.epsilon_high)
    if config.estimator == "gspo":
        objective = estimators.gspo(inputs, sample_ids=ids, samples=samples)
    elif config.estimator == "cispo":
        objective = estimators.cispo(inputs)
    else:
        objective = estimators.ppo_clip(inputs)
    pg = objective.loss
    is_weight_sum, is_truncated, masked_tokens, masked_sequences = float(keep.sum()), 0, 0, 0
    if sampling is not None:
        if rollout_logprobs is None:
            raise ConfigError(
                "importance sampling needs the rollout log-probs; pass them, or turn it off (tis_cap = false)"
            )
        fix = correction(old, rollout_logprobs, keep, sampling, sample_ids=ids, samples=samples)
        pg = pg * fix.weights.detach()
        is_weight_sum, is_truncated = fix.weight_sum, fix.truncated
        masked_tokens, masked_sequences = fix.masked_tokens, fix.masked_sequences
    mismatch_sum, mismatch_tokens = 0.0, 0
    if rollout_logprobs is not None:
        with torch.no_grad():
            mismatch = kl_k3(torch.where(keep, rollout_logprobs, 0.0), torch.where(keep, old, 0.0))
            mismatch_sum, mismatch_tokens = float(mismatch[keep].sum()), int(keep.sum())
    per_token_loss = pg
    kl_sum = 0.0
    if config.beta > 0:
        if ref_logprobs is None:
            raise ConfigError("a KL penalty (beta > 0) needs the reference model's log-probs")
        kl = kl_k3(logprobs, torch.where(keep, ref_logprobs, logprobs.detach()))
        per_token_loss = per_token_loss + config.beta * kl
        kl_sum = float(kl.detach()[keep].sum())
    if config.entropy_coef > 0:
        if entropy is None or not entropy.requires_grad:
            raise ConfigError("an entropy bonus (entropy_coef > 0) needs the policy's entropy with its gradient")
        per_token_loss = per_token_loss - config.entropy_coef * entropy
    loss = torch.where(keep, per_token_loss * weights, 0.0).sum()
    return LossOutput(
        loss=loss,
        tokens=int(keep.sum()),
        clipped_low=objective.clipped_low,
        clipped_high=objective.clipped_high,
        is_weight_sum=is_weight_sum,
        is_truncated=is_truncated,
        kl_sum=kl_sum,
        is_masked_tokens=masked_tokens,
        is_masked_sequences=masked_sequences,
        mismatch_kl_sum=mismatch_sum,
        mismatch_tokens=mismatch_tokens,
    )


def sft_loss(logprobs: torch.Tensor, mask: torch.Tensor, *, total_tokens: int | None = None) -> torch.Tensor:
    """Masked cross-entropy: minus the mean log-prob of the model tokens (``total_tokens`` of the whole batch)."""
    keep = mask.to(torch.bool)
    count = int(keep.sum()) if total_tokens is None else total_tokens
    return -torch.where(keep, logprobs, 0.0).sum() / max(count, 1)
