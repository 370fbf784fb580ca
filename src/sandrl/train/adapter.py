"""Trajectories to training samples: what the rollout side produced, as the trainer consumes it.

:func:`batch_from_groups` turns rollout groups into a :class:`~sandrl.train.batch.Batch`:

- an ``infra_error`` episode is never trained (the machinery failed, not the policy); it is
  left out of its group and counted in ``infra_errors``;
- an episode without a reward or without a model token (an agent error before any output) is
  left out and counted in ``untrainable``;
- a group whose remaining rewards are all equal carries no GRPO signal; it is counted (by
  :func:`~sandrl.train.batch.samples_from_groups`, ``zero_signal_groups``), not trained;
- an episode of several *segments* (:attr:`~sandrl.rollout.trajectory.Trajectory.segment_starts`:
  a harness re-sent its history in a form that did not extend the recorded ids) counts once in its
  group's advantage, and each segment with model tokens is trained as its own sequence with that
  advantage: every sequence is exactly what the model saw;
- an episode a budget cut short is trained, masked or penalised as ``[train] on_truncated`` says
  (:mod:`sandrl.train.truncation`, passed in as a :class:`~sandrl.train.truncation.TruncationPolicy`):
  a masked one counts in its group's advantages and then leaves the batch, a penalty lowers the reward
  the advantages are computed from; ``Adapted.truncation`` counts what was done, by budget.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from sandrl.rollout.trajectory import Trajectory
from sandrl.train.batch import Batch, TrainSample, samples_from_groups
from sandrl.train.loss_config import Advantage, ScaleRewards
from sandrl.train.staleness import oldest_version
from sandrl.train.truncation import TruncationCounts, TruncationPolicy


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
    truncation: TruncationCounts = field(default_factory=TruncationCounts)
    """The trained episodes that a budget cut short, and those the truncation policy masked or penalised."""


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
        stop_reason=trajectory.stop_reason or "",
        task_set=trajectory.task_set,
    )


def segment_samples(trajectory: Trajectory) -> list[TrainSample]:
    """One sample per segment of a trainable trajectory that holds model tokens (its reward on each)."""
    whole = to_sample(trajectory)
    spans = trajectory.segments()
    if len(spans) == 1:
        return [whole]
    return [
        replace(
            whole,
            token_ids=whole.token_ids[a:b],
            loss_mask=(0, *whole.loss_mask[a + 1 : b]),
            rollout_logprobs=whole.rollout_logprobs[a:b] if whole.rollout_logprobs is not None else None,
        )
        for a, b in spans
        if b - a >= 2 and any(whole.loss_mask[a + 1 : b])
    ]


def batch_from_groups(
    groups: Iterable[Sequence[Trajectory]],
    *,
    scale_rewards: ScaleRewards = "group",
    truncation: TruncationPolicy | None = None,
    advantage: Advantage = "grpo",
    epsilon: float = 1e-4,
) -> Adapted:
    """The GRPO batch of ``groups`` (each the trajectories of one task), with the dropped ones counted.

    ``truncation`` (default: ``on_truncated = "train"``) says what becomes of the episodes a budget cut short.
    """
    policy = truncation if truncation is not None else TruncationPolicy()
    counts = TruncationCounts()
    episodes = infra = untrainable = 0
    kept: list[list[TrainSample]] = []
    segmented: dict[str, list[TrainSample]] = {}
    masked: set[str] = set()
    verified: list[float] = []
    for group in groups:
        samples = []
        for trajectory in group:
            episodes += 1
            if trajectory.status == "infra_error":
                infra += 1
            elif not trajectory.trainable:
                untrainable += 1
            else:
                verdict = policy.judge(trajectory)
                counts.add(verdict)
                sample = to_sample(trajectory)
                verified.append(sample.reward)
                if verdict.penalty:
                    sample = replace(sample, reward=sample.reward + verdict.penalty)
                if verdict.masked:
                    masked.add(trajectory.episode_id)
                samples.append(sample)
                if len(trajectory.segments()) > 1:
                    segmented[trajectory.episode_id] = segment_samples(trajectory)
        kept.append(samples)
    batch = samples_from_groups(kept, scale_rewards=scale_rewards, epsilon=epsilon, advantage=advantage)
    if counts.penalty_sum:  # the step reports what the verifier gave; the penalties are counted apart
        batch = replace(batch, reward_mean=sum(verified) / len(verified))
    if masked:  # after the advantages: a masked episode still counts in its group's baseline
        batch = replace(batch, samples=tuple(s for s in batch.samples if s.episode_id not in masked))
    if segmented:
        expanded = [
            replace(part, reward=sample.reward, advantage=sample.advantage)
            for sample in batch.samples
            for part in segmented.get(sample.episode_id, [sample])
        ]
        batch = replace(batch, samples=tuple(expanded))
    return Adapted(batch=batch, episodes=episodes, infra_errors=infra, untrainable=untrainable, truncation=counts)
