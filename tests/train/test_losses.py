"""The GRPO family against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from sandrl.errors import ConfigError
from sandrl.train.losses import (
    LossConfig,
    importance_weights,
    kl_k3,
    policy_loss,
    sft_loss,
    token_weights,
)

NO_TIS = LossConfig(tis_cap=None)


def _close(actual: torch.Tensor, expected: list[list[float]]) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype))


MASK = torch.tensor([[0, 1, 1, 0], [0, 1, 1, 1]], dtype=torch.float32)  # 2 and 3 model tokens


def test_grpo_averages_each_sample_then_the_samples() -> None:
    w = token_weights(MASK, LossConfig(loss_type="grpo"))
    _close(w, [[0, 1 / 4, 1 / 4, 0], [0, 1 / 6, 1 / 6, 1 / 6]])


def test_dapo_weighs_every_token_of_the_batch_the_same() -> None:
    w = token_weights(MASK, LossConfig(loss_type="dapo"))
    _close(w, [[0, 0.2, 0.2, 0], [0, 0.2, 0.2, 0.2]])


def test_dr_grpo_divides_by_a_constant_token_budget() -> None:
    w = token_weights(MASK, LossConfig(loss_type="dr_grpo", max_tokens=4))
    _close(w, [[0, 1 / 8, 1 / 8, 0], [0, 1 / 8, 1 / 8, 1 / 8]])
    longest = token_weights(MASK, LossConfig(loss_type="dr_grpo"))  # budget = the most model tokens, 3
    _close(longest, [[0, 1 / 6, 1 / 6, 0], [0, 1 / 6, 1 / 6, 1 / 6]])


def _ratios(*ratios: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-probs (with grad) whose ratios to the old ones are ``ratios``, after a masked first token."""
    old = torch.tensor([[0.0, math.log(0.4), math.log(0.4)]])
    logp = (old + torch.tensor([[0.0, *map(math.log, ratios)]])).requires_grad_(True)
    return logp, old, torch.tensor([[0.0, 1.0, 1.0]])


def test_clip_higher_caps_a_positive_advantage_at_one_plus_epsilon_high() -> None:
    logp, old, mask = _ratios(1.5, 0.5)
    cfg = LossConfig(loss_type="dapo", epsilon_low=0.2, epsilon_high=0.28, tis_cap=None)
    out = policy_loss(logp, torch.tensor([1.0]), mask, cfg, old_logprobs=old)
    # token 1: min(1.5, 1.28) = 1.28 (clipped); token 2: min(0.5, 0.8) = 0.5; mean over 2 tokens, negated
    assert float(out.loss.detach()) == pytest.approx(-(1.28 + 0.5) / 2)
    assert (out.clipped_high, out.clipped_low, out.tokens) == (1, 0, 2)
    torch.autograd.backward(out.loss)
    assert logp.grad is not None
    # the clipped token gets no gradient; d(-r A / 2)/d logp = -r A / 2 = -0.25 for the other
    _close(logp.grad, [[0.0, 0.0, -0.25]])


def test_a_negative_advantage_is_clipped_at_one_minus_epsilon_low() -> None:
    logp, old, mask = _ratios(1.5, 0.5)
    cfg = LossConfig(loss_type="dapo", epsilon_low=0.2, epsilon_high=0.28, tis_cap=None)
    out = policy_loss(logp, torch.tensor([-1.0]), mask, cfg, old_logprobs=old)
    # token 1: -min(-1.5, -1.28) = 1.5; token 2: -min(-0.5, -0.8) = 0.8 (clipped)
    assert float(out.loss.detach()) == pytest.approx((1.5 + 0.8) / 2)
    assert (out.clipped_high, out.clipped_low) == (0, 1)


def test_one_update_per_batch_is_the_plain_policy_gradient() -> None:
    logp = torch.tensor([[0.0, -1.0, -2.0]], requires_grad=True)
    out = policy_loss(logp, torch.tensor([2.0]), torch.tensor([[0.0, 1.0, 1.0]]), NO_TIS)
    assert float(out.loss.detach()) == pytest.approx(-2.0)  # ratio 1: -A, averaged
    torch.autograd.backward(out.loss)
    assert logp.grad is not None
    _close(logp.grad, [[0.0, -1.0, -1.0]])  # -A / 2 tokens


def test_the_importance_weight_is_exactly_one_when_trainer_and_rollout_agree() -> None:
    logp = torch.tensor([[0.0, -0.7, -1.3, -2.9]])
    assert torch.equal(importance_weights(logp, logp.clone(), 2.0), torch.ones_like(logp))
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0]])
    with_is = policy_loss(logp, torch.tensor([1.5]), mask, LossConfig(), rollout_logprobs=logp.clone())
    without = policy_loss(logp, torch.tensor([1.5]), mask, NO_TIS)
    assert torch.equal(with_is.loss, without.loss)
    assert with_is.is_weight_sum == 3.0 and with_is.is_truncated == 0


def test_importance_weights_are_truncated_at_the_cap() -> None:
    old = torch.log(torch.tensor([[0.6, 0.3]]))
    rollout = torch.log(torch.tensor([[0.2, 0.2]]))  # ratios 3 and 1.5
    _close(importance_weights(old, rollout, 2.0), [[2.0, 1.5]])
    logp = torch.cat([torch.zeros(1, 1), old], dim=1)
    out = policy_loss(
        logp,
        torch.tensor([1.0]),
        torch.tensor([[0.0, 1.0, 1.0]]),
        LossConfig(loss_type="dapo", tis_cap=2.0),
        rollout_logprobs=torch.cat([torch.zeros(1, 1), rollout], dim=1),
    )
    assert float(out.loss.detach()) == pytest.approx(-(2.0 + 1.5) / 2)
    assert out.is_truncated == 1 and out.is_weight_sum == pytest.approx(3.5)


def test_k3_kl_by_hand() -> None:
    logp = torch.tensor([math.log(0.25), math.log(0.5)])
    ref = torch.tensor([math.log(0.5), math.log(0.5)])
    # ref/p = 2: 2 - ln 2 - 1; equal: 0
    assert kl_k3(logp, ref).tolist() == pytest.approx([1 - math.log(2), 0.0])
    out = policy_loss(
        torch.tensor([[0.0, math.log(0.25)]]),
        torch.tensor([0.0]),
        torch.tensor([[0.0, 1.0]]),
        LossConfig(beta=0.1, tis_cap=None),
        ref_logprobs=torch.tensor([[0.0, math.log(0.5)]]),
    )
    assert float(out.loss.detach()) == pytest.approx(0.1 * (1 - math.log(2)))
    assert out.kl_sum == pytest.approx(1 - math.log(2))


def test_masked_positions_cannot_leak_whatever_they_hold() -> None:
    logp = torch.tensor([[0.0, -1.0, -2.0, -0.5]])
    mask = torch.tensor([[0.0, 1.0, 0.0, 1.0]])
    garbage = torch.tensor([[1e9, -1.0, -1e9, -0.5]])
    cfg = LossConfig(beta=0.5)
    out = policy_loss(logp, torch.tensor([1.0]), mask, cfg, rollout_logprobs=garbage, ref_logprobs=garbage)
    clean = torch.tensor([[0.0, -1.0, 0.0, -0.5]])
    ref = policy_loss(logp, torch.tensor([1.0]), mask, cfg, rollout_logprobs=clean, ref_logprobs=clean)
    assert math.isfinite(float(out.loss.detach()))
    assert torch.equal(out.loss, ref.loss)


def test_sft_loss_is_the_mean_negative_log_prob_of_model_tokens() -> None:
    logp = torch.tensor([[-9.0, -1.0, -2.0], [-9.0, -9.0, -3.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 0.0, 1.0]])
    assert float(sft_loss(logp, mask)) == pytest.approx(2.0)
    assert float(sft_loss(logp, mask, total_tokens=6)) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"loss_type": "ppo"}, "loss_type must be"),
        ({"epsilon_low": 1.0}, "epsilon_low must be < 1"),
        ({"epsilon_high": -0.1}, "epsilon_high must be"),
        ({"beta": -1.0}, "beta"),
        ({"tis_cap": 0.5}, "tis_cap must be a number >= 1"),
        ({"max_tokens": 0}, "max_tokens must be >= 1"),
        ({"scale_rewards": "std"}, "scale_rewards must be"),
    ],
)
def test_bad_loss_options_are_rejected_with_the_fix(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        LossConfig(**kwargs)  # type: ignore[arg-type]


def _todays_policy_loss(
    logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    old: torch.Tensor,
    rollout: torch.Tensor,
    ref: torch.Tensor,
) -> tuple[torch.Tensor, int, int, float, int]:
    """The policy loss as it was before the estimators, importance levels and advantages were added (the oracle)."""
    keep = mask.to(torch.bool)
    weights = token_weights(mask, cfg)
    a = adv.unsqueeze(-1)
    ratio = torch.exp(torch.where(keep, logp - old, 0.0))
    pg = -torch.minimum(ratio * a, ratio.clamp(1 - cfg.epsilon_low, 1 + cfg.epsilon_high) * a)
    low = int((keep & (a < 0) & (ratio < 1 - cfg.epsilon_low)).sum())
    high = int((keep & (a > 0) & (ratio > 1 + cfg.epsilon_high)).sum())
    truncated, weight_sum = 0, float(keep.sum())
    if cfg.tis_cap is not None:
        w = torch.exp(torch.where(keep, old, 0.0) - torch.where(keep, rollout, 0.0)).clamp(max=cfg.tis_cap)
        pg = pg * w
        truncated, weight_sum = int((keep & (w >= cfg.tis_cap)).sum()), float(w[keep].sum())
    if cfg.beta > 0:
        pg = pg + cfg.beta * kl_k3(logp, torch.where(keep, ref, logp.detach()))
    return torch.where(keep, pg * weights, 0.0).sum(), low, high, weight_sum, truncated


@pytest.mark.parametrize(
    "config",
    [
        LossConfig(),
        LossConfig(loss_type="dapo", epsilon_high=0.28, tis_cap=1.5, beta=0.1),
        LossConfig(loss_type="dr_grpo", tis_cap=None, epsilon_low=0.1, scale_rewards="none"),
    ],
    ids=["defaults", "dapo-tis-kl", "dr_grpo"],
)
def test_the_defaults_give_exactly_todays_numbers(config: LossConfig) -> None:
    generator = torch.Generator().manual_seed(7)
    logp = -torch.rand(3, 6, generator=generator) * 3
    old = logp + (torch.rand(3, 6, generator=generator) - 0.5) * 0.8
    rollout = old + (torch.rand(3, 6, generator=generator) - 0.5) * 1.6
    ref = logp + (torch.rand(3, 6, generator=generator) - 0.5)
    mask = torch.tensor([[0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1], [0, 1, 0, 1, 1, 0]], dtype=torch.float32)
    adv = torch.tensor([1.3, -0.7, 0.4])
    mine, theirs = logp.clone().requires_grad_(True), logp.clone().requires_grad_(True)
    out = policy_loss(mine, adv, mask, config, old_logprobs=old, rollout_logprobs=rollout, ref_logprobs=ref)
    loss, low, high, weight_sum, truncated = _todays_policy_loss(theirs, adv, mask, config, old, rollout, ref)
    assert torch.equal(out.loss, loss)
    counts = (out.clipped_low, out.clipped_high, out.is_weight_sum, out.is_truncated)
    assert counts == (low, high, weight_sum, truncated)
    assert low + high > 0 and (config.tis_cap is None or truncated > 0)  # the example exercises clip and cap
    torch.autograd.backward(out.loss)
    torch.autograd.backward(loss)
    assert mine.grad is not None and theirs.grad is not None
    assert torch.equal(mine.grad, theirs.grad)


def test_k3_of_nearly_equal_log_probs_is_never_negative_and_is_half_the_square() -> None:
    """Two policies that agree to 1e-4 (an engine and a trainer on the same weights): exp(d) - d - 1 in
    float32 was rounding noise of either sign; the estimate must stay >= 0 and ~d^2 / 2."""
    from sandrl.train.losses import kl_k3

    p = -torch.rand(10_000) * 5
    d = (torch.rand(10_000) - 0.5) * 2e-4
    k3 = kl_k3(p, p + d)
    assert bool((k3 >= 0).all())
    assert torch.allclose(k3.double(), ((p + d) - p).double() ** 2 / 2, rtol=1e-2, atol=1e-12)
