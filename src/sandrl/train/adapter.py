"""Trajectories to training samples: what the rollout side produced, as the trainer consumes it.

:func:`batch_from_groups` turns rollout groups into a :class:`~sandrl.train.batch.Batch`:

- an ``infra_error`` episode is never trained (the machinery failed, not the policy); it is
  left out of its group and counted in ``infra_errors``;
- an episode without a reward or without a model token (an agent error before any output) is
  left out and counted in ``untrainable``;
- a group whose remaining rewards are all equal carries no GRPO signal; it is counted (by
  :func:`~sandrl.train.batch.samples_from_groups`, ``zero_signal_groups``), not trained.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sandrl.rollout.trajectory import Trajectory
from sandrl.train.batch import Batch, TrainSample, samples_from_groups
from sandrl.train.losses import ScaleRewards
from sandrl.train.staleness import oldest_version


@dataclass(frozen=True)
class Adapted:
    """A batch and what was left out of it on the way."""

    batch: Batch
    episodes: int
    """Episodes offered."""
    infra_errors: int
    """Episodes dropped because their status is ``infra_error``."""
    untrainable: int
    """Other episodes dropped: no reward, or no model token."""


def to_sample(trajectory: Trajectory) -> TrainSample:
    """One trainable trajectory as a :class:`TrainSample` (token fields copied as they are)."""
    if not trajectory.trainable:
        raise ValueError(f"{trajectory.episode_id} is not trainable (status {trajectory.status})")
    assert trajectory.reward is not None
    return TrainSample(
        token_ids=tuple(trajectory.ids),
        loss_mask=tuple(trajectory.loss_mask),
        rollout_logprobs=tuple(trajectory.logprobs),
        reward=trajectory.reward,
        group_id=trajectory.group_id,
        weight_version=oldest_version(trajectory) or 0,
        episode_id=trajectory.episode_id,
    )


def batch_from_groups(groups: Iterable[Sequence[Trajectory]], *, scale_rewards: ScaleRewards = "group") -> Adapted:
    """The GRPO batch of ``groups`` (each the trajectories of one task), with the dropped ones counted."""
    episodes = infra = untrainable = 0
    kept: list[list[TrainSample]] = []
    for group in groups:
        samples = []
        for trajectory in group:
            episodes += 1
            if trajectory.status == "infra_error":
                infra += 1
            elif not trajectory.trainable:
                untrainable += 1
            else:
                samples.append(to_sample(trajectory))
        kept.append(samples)
    batch = samples_from_groups(kept, scale_rewards=scale_rewards)
    return Adapted(batch=batch, episodes=episodes, infra_errors=infra, untrainable=untrainable)
