"""Samples, GRPO groups into advantages, and micro-batches that fit a token budget."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandrl.errors import TrainError
from sandrl.train import micro_batches
from sandrl.train.batch import Batch, TrainSample, samples_from_groups
from sandrl.train.micro_batches import collate

from .helpers import sample


def test_groups_become_advantages_and_groups_without_signal_are_counted_not_trained() -> None:
    learnable = [sample("q1", "a", reward=r, group_id="q1") for r in (1.0, 0.0, 0.0, 1.0)]
    all_right = [sample("q2", "b", reward=1.0, group_id="q2") for _ in range(4)]
    alone = [sample("q3", "c", reward=0.5, group_id="q3")]
    batch = samples_from_groups([learnable, all_right, alone], scale_rewards="none")
    assert [s.advantage for s in batch.samples] == [0.5, -0.5, -0.5, 0.5]
    assert {s.group_id for s in batch.samples} == {"q1"}
    assert (batch.groups, batch.zero_signal_groups, batch.zero_signal_samples) == (3, 2, 5)
    assert batch.reward_mean == pytest.approx((2 + 4 + 0.5) / 9)


def test_a_group_mixing_group_ids_is_refused() -> None:
    with pytest.raises(TrainError, match="several group ids"):
        samples_from_groups([[sample("a", "x", group_id="a"), sample("b", "y", group_id="b")]])


def test_a_batch_of_samples_with_their_own_advantages() -> None:
    batch = Batch.of([sample("a", "x", reward=1.0, group_id="a"), sample("b", "y", reward=0.0, group_id="b")])
    assert (batch.groups, batch.zero_signal_groups, batch.reward_mean) == (2, 0, 0.5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"token_ids": (1,), "loss_mask": (0,)}, "at least 2 tokens"),
        ({"token_ids": (1, 2, 3), "loss_mask": (0, 1)}, "loss mask has 2 entries but there are 3 tokens"),
        ({"token_ids": (1, 2), "loss_mask": (1, 1)}, "first token cannot be trained"),
        ({"token_ids": (1, 2), "loss_mask": (0, 2)}, "only 0 and 1"),
        ({"token_ids": (1, 2), "loss_mask": (0, 1), "rollout_logprobs": (0.0,)}, "1 rollout log-probs for 2 tokens"),
        ({"token_ids": (1, 2), "loss_mask": (0, 1), "reward": math.nan}, "must be finite"),
    ],
)
def test_malformed_samples_are_refused_with_what_is_wrong(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(TrainError, match=message):
        TrainSample(**kwargs)  # type: ignore[arg-type]


def test_lists_are_accepted_and_stored_as_tuples() -> None:
    s = TrainSample(token_ids=[5, 6, 7], loss_mask=[0, 1, 1], rollout_logprobs=[0, -1, -2])  # type: ignore[arg-type]
    assert s.token_ids == (5, 6, 7) and s.rollout_logprobs == (0.0, -1.0, -2.0)
    assert (s.num_tokens, s.num_model_tokens) == (3, 2)


@given(
    st.lists(st.integers(min_value=2, max_value=60), max_size=40),
    st.integers(min_value=2, max_value=200),
    st.booleans(),
)
def test_micro_batches_cover_every_sample_once_within_the_budget(
    lengths: list[int], budget: int, packing: bool
) -> None:
    plans = micro_batches.plan(lengths, budget, packing=packing)
    assert sorted(i for group in plans for i in group) == list(range(len(lengths)))
    for group in plans:
        cost = sum(lengths[i] for i in group) if packing else len(group) * max(lengths[i] for i in group)
        assert len(group) == 1 or cost <= budget


def test_collate_right_pads_and_masks_the_padding() -> None:
    samples = [sample("a", "xy", logprobs=None), sample("bbbb", "z")]
    mb = collate(samples, [1, 0], pad_id=999)
    long, short = samples[1].num_tokens, samples[0].num_tokens
    assert mb.input_ids.shape == (2, long)
    assert mb.input_ids[1, short:].tolist() == [999] * (long - short)
    assert mb.attention_mask[1].tolist() == [1] * short + [0] * (long - short)
    assert mb.loss_mask[1].tolist() == [float(m) for m in samples[0].loss_mask] + [0.0] * (long - short)
    assert mb.index == (1, 0)
