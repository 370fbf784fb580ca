"""Advantages from rewards, against values computed by hand: GRPO, RLOO, REINFORCE++ (and its -baseline)."""

from __future__ import annotations

import math

import pytest

from sandrl.train.advantages import (
    advantages,
    group_advantages,
    has_signal,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
)
from sandrl.train.batch import TrainSample, samples_from_groups


def test_group_advantages_centre_and_scale_by_the_group_std() -> None:
    # mean 0.5, unbiased std sqrt(1/3): (1 - 0.5) / sqrt(1/3) = sqrt(3)/2
    [adv] = group_advantages([[1.0, 0.0, 0.0, 1.0]], "group", epsilon=0.0)
    half_root3 = math.sqrt(3) / 2
    assert adv == pytest.approx([half_root3, -half_root3, -half_root3, half_root3])


def test_dr_grpo_advantages_are_only_centred() -> None:
    assert group_advantages([[1.0, 0.0, 0.0, 0.0]], "none") == [[0.75, -0.25, -0.25, -0.25]]


def test_batch_scaling_uses_the_spread_of_the_whole_batch() -> None:
    # batch [1, 0, .5, .5]: mean .5, unbiased variance (.25 + .25) / 3 = 1/6
    first, second = group_advantages([[1.0, 0.0], [0.5, 0.5]], "batch", epsilon=0.0)
    assert first == pytest.approx([0.5 / math.sqrt(1 / 6), -0.5 / math.sqrt(1 / 6)])
    assert second == [0.0, 0.0]


def test_a_group_whose_rewards_are_equal_has_no_signal() -> None:
    assert has_signal([0.0, 1.0])
    assert not has_signal([1.0, 1.0, 1.0])
    assert not has_signal([0.3])
    assert not has_signal([])


def test_rloo_subtracts_the_mean_of_the_other_rewards() -> None:
    # sample 0: 1 - mean(0, 0, 0) = 1; the others: 0 - mean(1, 0, 0) = -1/3
    assert rloo_advantages([[1.0, 0.0, 0.0, 0.0]])[0] == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])
    # G / (G - 1) times GRPO's centred reward
    [grpo] = group_advantages([[1.0, 0.0, 0.5, 0.25]], "none")
    [rloo] = rloo_advantages([[1.0, 0.0, 0.5, 0.25]])
    assert rloo == pytest.approx([4 / 3 * a for a in grpo])


def test_rloo_baseline_excludes_the_sample_itself() -> None:
    group = [0.9, 0.1, 0.4, 0.7]
    [adv] = rloo_advantages([group])
    for i, (r, a) in enumerate(zip(group, adv, strict=True)):
        others = group[:i] + group[i + 1 :]
        assert r - a == pytest.approx(sum(others) / len(others))
        # the sample's own reward moves its advantage one for one: its baseline does not see it
        changed = [*group[:i], r + 0.5, *group[i + 1 :]]
        assert rloo_advantages([changed])[0][i] == pytest.approx(a + 0.5)
    assert rloo_advantages([[0.3]]) == [[0.0]]


def test_rloo_takes_the_same_scaling_as_grpo() -> None:
    # [1, 0, 0, 1]: leave-one-out +-2/3, group std sqrt(1/3)
    [adv] = advantages([[1.0, 0.0, 0.0, 1.0]], "rloo", scale="group", epsilon=0.0)
    assert adv == pytest.approx([s * (2 / 3) / math.sqrt(1 / 3) for s in (1, -1, -1, 1)])


def test_reinforce_pp_normalises_over_the_batch_per_token() -> None:
    # rewards [1, 0, 0, 0] with 2, 1, 1, 4 model tokens: 8 tokens, mean 2/8 = 0.25;
    # unbiased variance (2 * 0.75^2 + 0.25^2 + 0.25^2 + 4 * 0.25^2) / 7 = 1.5 / 7
    std = math.sqrt(1.5 / 7)
    [adv] = reinforce_pp_advantages([[1.0, 0.0, 0.0, 0.0]], tokens=[[2, 1, 1, 4]], epsilon=0.0)
    assert adv == pytest.approx([0.75 / std, -0.25 / std, -0.25 / std, -0.25 / std])
    # per sample without tokens: mean 0.25, variance (0.5625 + 3 * 0.0625) / 3 = 0.25
    [per_sample] = reinforce_pp_advantages([[1.0, 0.0, 0.0, 0.0]], epsilon=0.0)
    assert per_sample == pytest.approx([1.5, -0.5, -0.5, -0.5])


def test_reinforce_pp_a_unanimous_group_still_has_signal_against_the_batch() -> None:
    # batch [1, 0, 1, 1]: mean 0.75, unbiased std 0.5; the all-right group is above the batch
    right, mixed = reinforce_pp_advantages([[1.0, 1.0], [1.0, 0.0]], epsilon=0.0)
    assert right == pytest.approx([0.5, 0.5]) and mixed == pytest.approx([0.5, -1.5])


def test_reinforce_pp_baseline_centres_per_group_then_scales_by_the_batch() -> None:
    # centred [0.75, -0.25, -0.25, -0.25] and [0.5, 0.5, -0.5, -0.5]: mean 0,
    # unbiased variance (0.5625 + 3 * 0.0625 + 4 * 0.25) / 7 = 0.25, std 0.5
    first, second = reinforce_pp_baseline_advantages([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]], epsilon=0.0)
    assert first == pytest.approx([1.5, -0.5, -0.5, -0.5])
    assert second == pytest.approx([1.0, 1.0, -1.0, -1.0])


def _sample(reward: float, group: str, model_tokens: int = 1) -> TrainSample:
    n = model_tokens + 1
    return TrainSample(token_ids=tuple(range(n)), loss_mask=(0,) + (1,) * model_tokens, reward=reward, group_id=group)


def test_samples_from_groups_uses_the_chosen_estimator() -> None:
    groups = [[_sample(1.0, "a"), _sample(0.0, "a"), _sample(0.0, "a"), _sample(0.0, "a")]]
    default = samples_from_groups(groups)
    assert [s.advantage for s in default.samples] == group_advantages([[1.0, 0.0, 0.0, 0.0]])[0]
    rloo = samples_from_groups(groups, advantage="rloo", scale_rewards="none")
    assert [s.advantage for s in rloo.samples] == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])


def test_reinforce_pp_trains_a_unanimous_group_and_weighs_tokens() -> None:
    unanimous = [_sample(1.0, "u", 3), _sample(1.0, "u", 1)]
    mixed = [_sample(1.0, "m", 1), _sample(0.0, "m", 3)]
    batch = samples_from_groups([unanimous, mixed], advantage="reinforce_pp", epsilon=0.0)
    assert batch.zero_signal_groups == 0 and len(batch.samples) == 4
    # tokens 3, 1, 1, 3 of rewards 1, 1, 1, 0: mean 5/8, unbiased variance (5 * 9/64 + 3 * 25/64) / 7 = 15/56
    std = math.sqrt(15 / 56)
    assert [s.advantage for s in batch.samples] == pytest.approx([0.375 / std] * 3 + [-0.625 / std])
    grpo = samples_from_groups([unanimous, mixed])
    assert grpo.zero_signal_groups == 1 and len(grpo.samples) == 2
    same = samples_from_groups([unanimous], advantage="reinforce_pp")
    assert same.zero_signal_groups == 1 and same.samples == ()
