"""The trainer's input: token-exact samples, GRPO groups turned into advantages, micro-batches.

A :class:`TrainSample` is one episode as the trainer sees it: the token ids of the whole
conversation, a loss mask that is 1 on the model's own tokens, and the log-prob the inference
server gave each of those tokens. :func:`samples_from_groups` turns groups (the samples of
one task) into a :class:`Batch` with advantages, dropping and counting the groups that carry no
signal. :mod:`sandrl.train.micro_batches` cuts a batch into forwards that fit a token budget.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from sandrl.errors import TrainError
from sandrl.train.advantages import advantages, has_signal
from sandrl.train.loss_config import Advantage, ScaleRewards


@dataclass(frozen=True)
class TrainSample:
    """One episode, token-exact. ``rollout_logprobs[t]`` is ``log p(token_ids[t] | token_ids[:t])`` as sampled."""

    token_ids: tuple[int, ...]
    """The whole conversation: prompt, model turns, observations, in order."""
    loss_mask: tuple[int, ...]
    """1 where the model produced the token (trained), 0 elsewhere; same length as ``token_ids``.
    The first token has no context to be predicted from, so its mask must be 0."""
    rollout_logprobs: tuple[float, ...] | None = None
    """The sampler's log-prob of each token (any value, e.g. 0, where the mask is 0); needed for
    importance sampling (``LossConfig.tis_cap``), not for supervised steps."""
    reward: float = 0.0
    advantage: float = 0.0
    """Set by :func:`samples_from_groups`; what the policy loss multiplies."""
    group_id: str = ""
    """The GRPO group: samples of the same task whose rewards are compared."""
    weight_version: int = 0
    """The policy version that generated the sample (the oldest, if a weight update landed mid-episode)."""
    episode_id: str = ""
    stop_reason: str = ""
    """What ended the episode (``submitted``, ``max_turns``, ``max_tokens``, ...; empty when unknown):
    the step's metrics are split by it (:mod:`sandrl.train.diagnostics`)."""
    task_set: str = ""
    """The task set the episode's task came from (``Trajectory.task_set``); metrics are split by it too."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "token_ids", tuple(int(t) for t in self.token_ids))
        object.__setattr__(self, "loss_mask", tuple(int(m) for m in self.loss_mask))
        if self.rollout_logprobs is not None:
            object.__setattr__(self, "rollout_logprobs", tuple(float(x) for x in self.rollout_logprobs))
        name = self.episode_id or self.group_id or "a sample"
        if len(self.token_ids) < 2:
            raise TrainError(f"{name}: a sample needs at least 2 tokens (a context and a token to predict)")
        if len(self.loss_mask) != len(self.token_ids):
            raise TrainError(
                f"{name}: the loss mask has {len(self.loss_mask)} entries but there are {len(self.token_ids)} tokens; "
                "they must be aligned one to one"
            )
        if self.rollout_logprobs is not None and len(self.rollout_logprobs) != len(self.token_ids):
            raise TrainError(
                f"{name}: {len(self.rollout_logprobs)} rollout log-probs for {len(self.token_ids)} tokens; "
                "give one per token (0 where the loss mask is 0)"
            )
        if any(m not in (0, 1) for m in self.loss_mask):
            raise TrainError(f"{name}: the loss mask must hold only 0 and 1")
        if self.loss_mask[0]:
            raise TrainError(f"{name}: the first token cannot be trained (nothing precedes it); set its mask to 0")
        if not math.isfinite(self.reward) or not math.isfinite(self.advantage):
            raise TrainError(f"{name}: reward and advantage must be finite, got {self.reward!r}, {self.advantage!r}")

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_model_tokens(self) -> int:
        return sum(self.loss_mask)


@dataclass(frozen=True)
class Batch:
    """The samples of one training step, with the groups that were left out counted."""

    samples: tuple[TrainSample, ...]
    groups: int = 0
    """Groups offered, trained or not."""
    zero_signal_groups: int = 0
    """Groups dropped because all their rewards were equal (no advantage, nothing to learn)."""
    zero_signal_samples: int = 0
    reward_mean: float = 0.0
    """Mean reward over every sample offered, the dropped groups included."""

    @classmethod
    def of(cls, samples: Iterable[TrainSample]) -> Batch:
        """A batch of samples whose advantages are already set (or a supervised batch)."""
        items = tuple(samples)
        mean = sum(s.reward for s in items) / len(items) if items else 0.0
        return cls(items, groups=len({s.group_id for s in items}), reward_mean=mean)


def samples_from_groups(
    groups: Iterable[Sequence[TrainSample]],
    *,
    scale_rewards: ScaleRewards = "group",
    epsilon: float = 1e-4,
    advantage: Advantage = "grpo",
) -> Batch:
    """A batch with advantages from ``advantage``'s estimator (see :mod:`sandrl.train.advantages`).

    Each group is the samples of one task; they must share a ``group_id``. A group whose rewards
    are all equal (including a group of one) has no signal against its own baseline and is dropped
    and counted in ``zero_signal_groups``; with ``advantage="reinforce_pp"``, whose baseline is the
    batch's, only a batch whose rewards are all equal is. Batch-wide statistics
    (``scale_rewards="batch"``, REINFORCE++'s) are measured over the groups that are kept.
    """
    offered = [list(g) for g in groups]
    for group in offered:
        ids = {s.group_id for s in group}
        if len(ids) > 1:
            raise TrainError(f"a group holds samples of several group ids {sorted(ids)}; pass one group per task")
    if advantage == "reinforce_pp":
        everyone = [s.reward for g in offered for s in g]
        kept = [g for g in offered if g] if has_signal(everyone) else []
    else:
        kept = [g for g in offered if has_signal([s.reward for s in g])]
    values = advantages(
        [[s.reward for s in g] for g in kept],
        advantage,
        scale=scale_rewards,
        epsilon=epsilon,
        tokens=[[s.num_model_tokens for s in g] for g in kept],
    )
    samples = tuple(
        replace(s, advantage=a)
        for group, advs in zip(kept, values, strict=True)
        for s, a in zip(group, advs, strict=True)
    )
    rewards = [s.reward for g in offered for s in g]
    return Batch(
        samples=samples,
        groups=len(offered),
        zero_signal_groups=len(offered) - len(kept),
        zero_signal_samples=len(rewards) - len(samples),
        reward_mean=sum(rewards) / len(rewards) if rewards else 0.0,
    )
