"""Importance sampling per token, per sequence and by geometric mean, truncated or masked, against hand values."""

from __future__ import annotations

import math

import pytest
import torch

from sandrl.errors import ConfigError
from sandrl.train.loss_config import ImportanceConfig
from sandrl.train.losses import LossConfig, policy_loss

# Two samples after a prompt token: the trainer's proximal log-probs over the engine's give the ratios
# 3, 1.5, 0.4 (sample 0) and 1.3, 1.3, 1.3, 1.3 (sample 1; product 2.86, geometric mean 1.3).
RATIOS = [[3.0, 1.5, 0.4], [1.3, 1.3, 1.3, 1.3]]


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Proximal (= current: one update per batch) and rollout log-probs, and the loss mask."""
    logp = torch.full((2, 5), math.log(0.5))
    rollout = logp.clone()
    mask = torch.zeros(2, 5)
    for row, ratios in enumerate(RATIOS):
        rollout[row, 1 : 1 + len(ratios)] -= torch.tensor([math.log(r) for r in ratios])
        mask[row, 1 : 1 + len(ratios)] = 1
    return logp, rollout, mask


def _loss(importance: ImportanceConfig, advantages: tuple[float, float] = (1.0, 1.0)):  # type: ignore[no-untyped-def]
    logp, rollout, mask = _batch()
    config = LossConfig(loss_type="dapo", importance=importance)
    return policy_loss(logp, torch.tensor(advantages), mask, config, rollout_logprobs=rollout)


def test_token_mask_drops_exactly_the_tokens_outside_the_band() -> None:
    out = _loss(ImportanceConfig(level="token", mode="mask", band=(0.5, 2.0)))
    # 3 and 0.4 leave [0.5, 2]; the others keep their ratio as weight; dapo divides by all 7 tokens
    kept = [1.5, 1.3, 1.3, 1.3, 1.3]
    assert float(out.loss) == pytest.approx(-sum(kept) / 7)
    assert (out.is_masked_tokens, out.is_masked_sequences, out.is_truncated) == (2, 0, 0)
    assert out.is_weight_sum == pytest.approx(sum(kept))


def test_token_truncation_clamps_into_the_band() -> None:
    out = _loss(ImportanceConfig(level="token", mode="truncate", band=(0.5, 2.0)))
    weights = [2.0, 1.5, 0.5, 1.3, 1.3, 1.3, 1.3]
    assert float(out.loss) == pytest.approx(-sum(weights) / 7)
    assert (out.is_truncated, out.is_masked_tokens) == (2, 0)
    # low = 0 truncates only above, as tis_cap does
    cap = _loss(ImportanceConfig(band=(0.0, 2.0)))
    assert cap.is_weight_sum == pytest.approx(2.0 + 1.5 + 0.4 + 4 * 1.3) and cap.is_truncated == 1


def test_sequence_mask_drops_whole_samples_whose_product_leaves_the_band() -> None:
    out = _loss(ImportanceConfig(level="sequence", mode="mask", band=(0.5, 2.0)))
    # products: 3 * 1.5 * 0.4 = 1.8 (kept, every token weighs 1.8) and 1.3^4 = 2.8561 (dropped whole)
    assert float(out.loss) == pytest.approx(-3 * 1.8 / 7)
    assert (out.is_masked_tokens, out.is_masked_sequences) == (4, 1)
    assert out.is_weight_sum == pytest.approx(3 * 1.8)


def test_geometric_mask_measures_the_length_normalised_ratio() -> None:
    out = _loss(ImportanceConfig(level="geometric", mode="mask", band=(0.5, 1.2)))
    # geometric means: 1.8^(1/3) ~ 1.216 (dropped: above 1.2) and 1.3 (dropped); with a band to 1.25, the first stays
    assert (out.is_masked_tokens, out.is_masked_sequences) == (7, 2)
    assert float(out.loss) == 0.0
    wider = _loss(ImportanceConfig(level="geometric", mode="mask", band=(0.5, 1.25)))
    g = 1.8 ** (1 / 3)
    assert (wider.is_masked_tokens, wider.is_masked_sequences) == (4, 1)
    assert float(wider.loss) == pytest.approx(-3 * g / 7)


def test_sequence_truncation_clamps_one_weight_per_sample() -> None:
    out = _loss(ImportanceConfig(level="sequence", mode="truncate", band=(0.0, 2.0)), advantages=(1.0, -1.0))
    # sample 0 weighs 1.8 per token, sample 1 min(2.8561, 2) = 2 per token (all 4 counted truncated)
    assert float(out.loss) == pytest.approx((-3 * 1.8 + 4 * 2.0) / 7)
    assert (out.is_truncated, out.is_masked_tokens) == (4, 0)


def test_a_sequence_ratio_too_large_for_a_float_is_still_clamped_or_masked() -> None:
    logp, rollout, mask = _batch()
    rollout[1, 1:5] = -1e4  # the engine gave these tokens ~0 probability: the product overflows
    for mode, weight in (("truncate", 2.0), ("mask", 0.0)):
        config = LossConfig(importance=ImportanceConfig(level="sequence", mode=mode, band=(0.0, 2.0)))  # type: ignore[arg-type]
        out = policy_loss(logp, torch.tensor([1.0, 1.0]), mask, config, rollout_logprobs=rollout)
        assert math.isfinite(float(out.loss))
        assert out.is_weight_sum == pytest.approx(3 * min(1.8, 2.0) + 4 * weight)


def test_the_mismatch_kl_is_k3_of_the_engine_against_the_trainer() -> None:
    out = _loss(ImportanceConfig())
    # per token, d = old - rollout = log(ratio): exp(d) - d - 1 = ratio - log(ratio) - 1
    expected = sum(r - math.log(r) - 1 for ratios in RATIOS for r in ratios)
    assert out.mismatch_kl_sum == pytest.approx(expected) and out.mismatch_tokens == 7
    logp, _, mask = _batch()
    agree = policy_loss(logp, torch.tensor([1.0, 1.0]), mask, LossConfig(), rollout_logprobs=logp.clone())
    assert agree.mismatch_kl_sum == 0.0
    without = policy_loss(logp, torch.tensor([1.0, 1.0]), mask, LossConfig(tis_cap=None))
    assert (without.mismatch_kl_sum, without.mismatch_tokens) == (0.0, 0)


def test_tis_cap_is_the_token_truncation_shorthand() -> None:
    assert LossConfig(tis_cap=3.0).importance_sampling == ImportanceConfig(band=(0.0, 3.0))
    assert LossConfig(tis_cap=None).importance_sampling is None
    logp, rollout, mask = _batch()
    short = policy_loss(logp, torch.tensor([1.0, -1.0]), mask, LossConfig(tis_cap=2.5), rollout_logprobs=rollout)
    table = LossConfig(importance=ImportanceConfig(band=(0.0, 2.5)))
    spelled = policy_loss(logp, torch.tensor([1.0, -1.0]), mask, table, rollout_logprobs=rollout)
    assert torch.equal(short.loss, spelled.loss) and short.is_truncated == spelled.is_truncated == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"band": (2.0, 0.5)}, r"band's low \(2.0\) is above its high \(0.5\)"),
        ({"band": (0.0, 0.0)}, "band's high must be > 0"),
        ({"band": (0.0, -1.0)}, "band's high must be > 0"),
        ({"band": (1.5, 3.0)}, "must hold 1"),
        ({"band": (0.0, 0.9)}, "must hold 1"),
        ({"band": (0.0, math.inf)}, "two finite numbers"),
        ({"band": (0.5, 1.0, 2.0)}, "two finite numbers"),
        ({"level": "tokens"}, "level must be"),
        ({"mode": "clip"}, "mode must be"),
    ],
)
def test_bad_bands_and_choices_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ImportanceConfig(**kwargs)  # type: ignore[arg-type]
