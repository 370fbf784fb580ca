"""GSPO and CISPO against a group of 4 computed by hand, beside PPO's clip; packed rows give padded rows' loss."""

from __future__ import annotations

import math

import pytest
import torch

from sandrl.train.advantages import rloo_advantages
from sandrl.train.batch import TrainSample
from sandrl.train.loss_config import ImportanceConfig
from sandrl.train.losses import LossConfig, policy_loss, token_weights
from sandrl.train.micro_batches import collate

# A group of 4: rewards [1, 0, 0, 0], RLOO advantages [1, -1/3, -1/3, -1/3]; 1, 2, 2 and 3 model tokens
# after a prompt token, whose ratios to the proximal policy are:
RATIOS = [[1.5], [2.0, 0.5], [0.9, 0.9], [0.5, 0.5, 0.7]]
[ADVANTAGES] = rloo_advantages([[1.0, 0.0, 0.0, 0.0]])
CLIP = {"epsilon_low": 0.2, "epsilon_high": 0.28, "tis_cap": None}  # the clip range is [0.8, 1.28]


def _group() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-probs (a leaf, with grad), proximal log-probs and the loss mask of the group, one sample a row."""
    width = 1 + max(map(len, RATIOS))
    old = torch.full((4, width), math.log(0.3))
    delta = torch.zeros(4, width)
    mask = torch.zeros(4, width)
    for row, ratios in enumerate(RATIOS):
        delta[row, 1 : 1 + len(ratios)] = torch.tensor([math.log(r) for r in ratios])
        mask[row, 1 : 1 + len(ratios)] = 1
    return (old + delta).requires_grad_(True), old, mask


def test_gspo_clips_one_geometric_mean_ratio_per_sample() -> None:
    logp, old, mask = _group()
    out = policy_loss(logp, torch.tensor(ADVANTAGES), mask, LossConfig(estimator="gspo", **CLIP), old_logprobs=old)
    # s = geometric mean of the ratios: 1.5, 1, 0.9 and 0.175^(1/3) ~ 0.559
    s3 = 0.175 ** (1 / 3)
    a = -1 / 3
    per_sample = [
        -min(1.5 * 1, 1.28 * 1),  # clipped above: the whole sample
        -min(1.0 * a, 1.0 * a),  # inside: although its tokens' ratios, 2 and 0.5, are outside
        -min(0.9 * a, 0.9 * a),
        -min(s3 * a, 0.8 * a),  # clipped below with a negative advantage: the whole sample
    ]
    assert float(out.loss.detach()) == pytest.approx(sum(per_sample) / 4)  # grpo: the mean of sample means
    assert (out.clipped_high, out.clipped_low, out.tokens) == (1, 3, 8)
    torch.autograd.backward(out.loss)
    assert logp.grad is not None
    # each token of an unclipped sample: d(-s_t A)/d logp_t = -s A, weighted 1 / (4 samples x its tokens)
    expected = torch.zeros_like(logp)
    expected[1, 1:3] = -1.0 * a / 8
    expected[2, 1:3] = -0.9 * a / 8
    torch.testing.assert_close(logp.grad, expected)


def test_cispo_clips_the_weight_and_keeps_every_token() -> None:
    logp, old, mask = _group()
    config = LossConfig(estimator="cispo", loss_type="dapo", **CLIP)
    out = policy_loss(logp, torch.tensor(ADVANTAGES), mask, config, old_logprobs=old)
    weights = [[1.28], [1.28, 0.8], [0.9, 0.9], [0.8, 0.8, 0.8]]  # clip(r, 0.8, 1.28)
    values = [-w * adv for ws, adv in zip(weights, ADVANTAGES, strict=True) for w in ws]
    assert float(out.loss.detach()) == pytest.approx(sum(values) / 8)  # dapo: the mean over the 8 tokens
    assert (out.clipped_high, out.clipped_low) == (2, 4)  # 1.5 and 2 above; 0.5, 0.5, 0.5 and 0.7 below
    torch.autograd.backward(out.loss)
    assert logp.grad is not None
    expected = torch.zeros_like(logp)
    for row, (ws, adv) in enumerate(zip(weights, ADVANTAGES, strict=True)):
        expected[row, 1 : 1 + len(ws)] = torch.tensor([-w * adv / 8 for w in ws])
    torch.testing.assert_close(logp.grad, expected)
    # PPO's clip drops the gradient of the first sample (ratio 1.5, positive advantage); CISPO keeps it
    assert float(logp.grad[0, 1]) == pytest.approx(-1.28 / 8)


def test_cispo_has_the_gradient_of_the_papers_logp_form() -> None:
    logp, old, mask = _group()
    adv = torch.tensor(ADVANTAGES)
    config = LossConfig(estimator="cispo", loss_type="dapo", **CLIP)
    torch.autograd.backward(policy_loss(logp, adv, mask, config, old_logprobs=old).loss)
    ours = logp.grad
    paper_logp = logp.detach().clone().requires_grad_(True)
    weight = torch.exp(paper_logp.detach() - old).clamp(0.8, 1.28)
    paper = -(weight * adv.unsqueeze(-1) * paper_logp * mask).sum() / mask.sum()  # MiniMax-M1's objective, negated
    torch.autograd.backward(paper)
    torch.testing.assert_close(ours, paper_logp.grad)


def test_gspo_is_grpo_when_every_sample_has_one_token() -> None:
    generator = torch.Generator().manual_seed(3)
    old = -torch.rand(12, 2, generator=generator) * 2
    logp = (old + (torch.rand(12, 2, generator=generator) - 0.5) * 0.8).requires_grad_(True)
    rollout = old + (torch.rand(12, 2, generator=generator) - 0.5)
    mask = torch.tensor([[0.0, 1.0]] * 12)
    adv = torch.randn(12, generator=generator)
    results = []
    for estimator, level in (("ppo", "token"), ("gspo", "sequence"), ("gspo", "geometric")):
        leaf = logp.detach().clone().requires_grad_(True)
        band = ImportanceConfig(level=level, band=(0.0, 1.2))  # type: ignore[arg-type]
        config = LossConfig(estimator=estimator, epsilon_low=0.1, epsilon_high=0.15, importance=band)  # type: ignore[arg-type]
        out = policy_loss(leaf, adv, mask, config, old_logprobs=old, rollout_logprobs=rollout)
        torch.autograd.backward(out.loss)
        results.append((out, leaf.grad))
    (ppo, ppo_grad), *others = results
    assert ppo.clipped_low + ppo.clipped_high > 0 and ppo.is_truncated > 0  # the example exercises both
    for out, grad in others:
        torch.testing.assert_close(out.loss, ppo.loss)
        torch.testing.assert_close(grad, ppo_grad)
        assert (out.clipped_low, out.clipped_high, out.is_truncated) == (
            ppo.clipped_low,
            ppo.clipped_high,
            ppo.is_truncated,
        )


def _samples() -> list[TrainSample]:
    lengths = [5, 3, 4, 2]
    return [TrainSample(tuple(range(1, n + 1)), (0,) + (1,) * (n - 1), rollout_logprobs=(0.0,) * n) for n in lengths]


@pytest.mark.parametrize(
    "config",
    [
        LossConfig(
            estimator="gspo",
            epsilon_low=0.05,
            epsilon_high=0.05,
            importance=ImportanceConfig(level="geometric", mode="mask", band=(0.8, 1.25)),
        ),
        LossConfig(estimator="cispo", loss_type="dapo", importance=ImportanceConfig(level="sequence", band=(0.5, 1.5))),
        LossConfig(estimator="ppo", loss_type="dr_grpo", importance=ImportanceConfig(mode="mask", band=(0.7, 1.3))),
    ],
    ids=["gspo-geometric-mask", "cispo-sequence-truncate", "ppo-token-mask"],
)
def test_packed_rows_give_the_loss_of_one_sample_a_row(config: LossConfig) -> None:
    samples = _samples()
    generator = torch.Generator().manual_seed(11)
    width = max(s.num_tokens for s in samples)
    old = -torch.rand(len(samples), width, generator=generator) * 2
    current = old + (torch.rand(len(samples), width, generator=generator) - 0.5) * 0.6
    rollout = old + (torch.rand(len(samples), width, generator=generator) - 0.5) * 2
    advantages = torch.tensor([[1.0], [-0.5], [0.7], [-1.2]]).expand(-1, width)
    results = []
    for packing in (False, True):
        mb = collate(samples, range(len(samples)), pad_id=0, packing=packing, row_tokens=9)
        table = current.clone().requires_grad_(True)
        ids = mb.sample_ids if packing else None
        out = policy_loss(
            mb.take(table),
            mb.take(advantages),
            mb.loss_mask,
            config,
            old_logprobs=mb.take(old),
            rollout_logprobs=mb.take(rollout),
            sample_ids=ids,
            weights=token_weights(mb.loss_mask, config, sample_ids=ids),
        )
        torch.autograd.backward(out.loss)
        results.append((mb, out, table.grad))
    (padded_mb, padded, padded_grad), (packed_mb, packed, packed_grad) = results
    assert packed_mb.input_ids.shape[0] < padded_mb.input_ids.shape[0]  # two samples share a row
    torch.testing.assert_close(packed.loss, padded.loss)
    torch.testing.assert_close(packed_grad, padded_grad)
    for name in ("tokens", "clipped_low", "clipped_high", "is_truncated", "is_masked_tokens", "is_masked_sequences"):
        assert getattr(packed, name) == getattr(padded, name), name
    assert packed.is_weight_sum == pytest.approx(padded.is_weight_sum)
    assert packed.mismatch_kl_sum == pytest.approx(padded.mismatch_kl_sum)
    # the example exercises the clip and the importance weights, so the equality means something
    assert packed.clipped_low + packed.clipped_high > 0
    assert packed.is_truncated + packed.is_masked_tokens > 0


def test_sample_ids_number_the_samples_of_each_row() -> None:
    mb = collate(_samples(), [0, 2, 1, 3], pad_id=0, packing=True, row_tokens=9)
    # rows of 9: [5 tokens of sample 0, 4 of sample 2], [3 of sample 1, 2 of sample 3, 4 of padding]
    assert mb.sample_ids.tolist() == [[0] * 5 + [1] * 4, [2] * 3 + [3] * 2 + [-1] * 4]
    padded = collate(_samples(), [0, 1], pad_id=0)
    assert padded.sample_ids.tolist() == [[0] * 5, [1] * 3 + [-1] * 2]
