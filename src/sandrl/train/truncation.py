"""What training does with an episode that a budget cut short: ``[train] on_truncated``.

An episode ends ``truncated`` when one of its budgets ran out before the agent finished
(:attr:`~sandrl.rollout.trajectory.Trajectory.stop_reason` says which): ``max_tokens`` (the
conversation reached ``[rollout] max_total_tokens``), ``max_turns`` or ``wall_time``. The verifier
still scores what the sandbox holds, so such an episode has a reward; what that reward says about
the tokens the policy wrote is another matter. Three policies, applied only to the budgets named
in ``[train] truncated_by``:

- ``train`` (the default): trained exactly like a finished episode (sandrl's behaviour before
  the option existed).
- ``mask``: DAPO's *overlong filtering* (Yu et al. 2025, arXiv:2503.14476, section 3.4): the
  episode gives no policy-gradient token, but its reward still counts in its group's mean and
  spread, as in DAPO and verl, where the group's advantages are computed over every sample and
  the truncated ones' loss is masked afterwards. Leaving it out of the baseline instead would
  estimate the policy's expected reward from the episodes that happened to finish in time: a
  baseline biased towards the short ones. The masked episode leaves the batch once its group's
  advantages are set (no forward, no token in any aggregation): with ``loss_type = "dapo"`` that
  is exactly a zeroed loss mask, with ``grpo``/``dr_grpo`` it also leaves the count of samples the
  loss is averaged over, as verl's ``seq-mean-token-mean`` does for a fully masked sequence.
- ``penalty``: DAPO's *soft overlong punishment* (arXiv:2503.14476, section 3.4) on the token
  budget, a fixed penalty on the turn budget and a mask on the time budget:

  - Every trained episode, finished or not, gets ``overlong_penalty * R_length`` added to its
    reward, with ``L_max`` the token budget, ``L_cache = overlong_buffer`` and ``|y|`` its
    length as the budget counts it (the ids of its longest segment: prompt, replies and
    observations, the sequence the model saw)::

        R_length = 0                            if |y| <= L_max - L_cache
                 = ((L_max - L_cache) - |y|) / L_cache   if L_max - L_cache < |y| <= L_max
                 = -1                           if |y| > L_max

    so the penalty grows linearly from 0 to ``-overlong_penalty`` over the last
    ``overlong_buffer`` tokens before the budget. An episode the token budget cut gets the
    whole ``-overlong_penalty`` whatever its recorded length: its next turn did not fit, it is the
    ``|y| > L_max`` case (the budget stops it before the ids are written).
  - ``max_turns``: ``-overlong_penalty``, fixed. How many turns an episode takes is the policy's
    doing, as its length is; there is no length to shape by.
  - ``wall_time``: masked, as ``mask`` does (its reward, length-shaped as every other's, still
    counts in its group). How long an episode takes depends on how loaded the sandbox hosts and
    the inference server were, not on the policy alone: a penalty would punish the policy for
    the machines.

  The reward the advantages are computed from is the shaped one, and so is the test of a
  group's signal: a group whose verifier rewards are equal but whose episodes' lengths differ
  carries the length's signal and is trained (DAPO's recipe filters groups on accuracy instead;
  here a group is dropped exactly when its advantages would all be 0). The step's
  ``reward_mean`` stays the verifier's.

An episode that failed for the machinery (``infra_error``) is never trained, whatever the
policy; an episode that ended on an error of the agent's is not truncated and is trained as
before (under ``penalty`` its length is shaped as every episode's).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal, get_args

from sandrl.errors import ConfigError
from sandrl.rollout.trajectory import Trajectory

OnTruncated = Literal["train", "mask", "penalty"]
ON_TRUNCATED: tuple[OnTruncated, ...] = get_args(OnTruncated)

TruncatedBy = Literal["max_tokens", "max_turns", "wall_time"]
"""The budgets that end an episode ``truncated`` (its ``stop_reason``)."""
TRUNCATED_BY: tuple[TruncatedBy, ...] = get_args(TruncatedBy)


def overlong_shaping(length: int, budget: int, buffer: int) -> float:
    """DAPO's ``R_length`` (arXiv:2503.14476, section 3.4) of a sequence of ``length`` ids: 0 to -1.

    ``budget`` is ``L_max``, ``buffer`` is ``L_cache``; a buffer wider than the budget (a policy whose
    context is shorter than the run's token budget) ramps over the whole budget.
    """
    start = budget - min(buffer, budget)
    if length <= start:
        return 0.0
    if length <= budget:
        return (start - length) / (budget - start)
    return -1.0


def check_settings(
    on_truncated: str, truncated_by: tuple[str, ...], overlong_buffer: int, overlong_penalty: float
) -> None:
    """Raise :class:`ConfigError` naming the ``[train]`` key whose value cannot be used."""
    if on_truncated not in ON_TRUNCATED:
        raise ConfigError(f"on_truncated must be one of {', '.join(map(repr, ON_TRUNCATED))}, got {on_truncated!r}")
    wrong = [r for r in truncated_by if r not in TRUNCATED_BY]
    if wrong:
        raise ConfigError(
            f"truncated_by names the budgets that end an episode truncated: {', '.join(map(repr, TRUNCATED_BY))}; "
            f"got {', '.join(map(repr, wrong))}"
        )
    if on_truncated != "train" and not truncated_by:
        raise ConfigError(
            f"truncated_by is empty, so on_truncated = {on_truncated!r} acts on no episode: name the budgets it "
            f"applies to ({', '.join(map(repr, TRUNCATED_BY))}) or set on_truncated = 'train'"
        )
    if isinstance(overlong_buffer, bool) or not isinstance(overlong_buffer, int) or overlong_buffer < 0:
        raise ConfigError(
            f"overlong_buffer must be a number of tokens >= 0 (DAPO: 4096 before a budget of 20480), "
            f"got {overlong_buffer!r}"
        )
    if not math.isfinite(overlong_penalty) or overlong_penalty <= 0:
        raise ConfigError(f"overlong_penalty must be a finite number > 0 (DAPO: 1.0), got {overlong_penalty!r}")


def check_budgets(
    on_truncated: str, truncated_by: tuple[str, ...], overlong_buffer: int, *, max_total_tokens: int, max_turns: int
) -> None:
    """Refuse settings that the rollout's budgets make useless or harmful (a :class:`ConfigError`, one line)."""
    if on_truncated == "penalty" and "max_tokens" in truncated_by and overlong_buffer >= max_total_tokens:
        raise ConfigError(
            f"[train] overlong_buffer ({overlong_buffer}) must be less than [rollout] max_total_tokens "
            f"({max_total_tokens}), the token budget the penalty ramps up to: DAPO uses a fifth of it "
            f"({max_total_tokens // 5})"
        )
    if on_truncated != "train" and "max_turns" in truncated_by and max_turns == 1:
        raise ConfigError(
            f"[train] on_truncated = {on_truncated!r} with [rollout] max_turns = 1: every episode that runs a "
            "command ends by its turn budget, and would be "
            + ("masked" if on_truncated == "mask" else "penalised (submitting without acting would pay best)")
            + "; leave 'max_turns' out of [train] truncated_by"
        )


def cut_short_by(trajectory: Trajectory) -> TruncatedBy | None:
    """The budget that ended ``trajectory`` (None: it was not truncated)."""
    if trajectory.status != "truncated":
        return None
    return next((budget for budget in TRUNCATED_BY if budget == trajectory.stop_reason), None)


@dataclass(frozen=True)
class Verdict:
    """What the policy does with one trained episode."""

    truncated_by: TruncatedBy | None
    """The budget that cut it short; None when it was not truncated."""
    masked: bool = False
    """It gives no policy-gradient token (its reward still counts in its group)."""
    penalty: float = 0.0
    """Added to its reward before the advantages (<= 0)."""


@dataclass(frozen=True)
class TruncationPolicy:
    """``[train] on_truncated`` with its settings and the run's token budget; see the module docstring."""

    on_truncated: OnTruncated = "train"
    truncated_by: tuple[TruncatedBy, ...] = TRUNCATED_BY
    overlong_buffer: int = 4096
    overlong_penalty: float = 1.0
    token_budget: int | None = None
    """``L_max``: the conversation's budget of ids the agent loop enforces (``[rollout] max_total_tokens``,
    capped at the policy's context). Needed by ``penalty`` on ``max_tokens``."""

    def __post_init__(self) -> None:
        check_settings(self.on_truncated, self.truncated_by, self.overlong_buffer, self.overlong_penalty)
        if self.shapes_length and (self.token_budget is None or self.token_budget < 1):
            raise ConfigError(
                f"on_truncated = 'penalty' on max_tokens shapes rewards by length up to the token budget; "
                f"give it the rollout's budget (>= 1), got {self.token_budget!r}"
            )

    @property
    def shapes_length(self) -> bool:
        return self.on_truncated == "penalty" and "max_tokens" in self.truncated_by

    def judge(self, trajectory: Trajectory) -> Verdict:
        """The verdict on one trained (:attr:`~sandrl.rollout.trajectory.Trajectory.trainable`) episode."""
        cut_by = cut_short_by(trajectory)
        if self.on_truncated == "train":
            return Verdict(cut_by)
        acts = cut_by is not None and cut_by in self.truncated_by
        if self.on_truncated == "mask":
            return Verdict(cut_by, masked=acts)
        if acts and cut_by in ("max_tokens", "max_turns"):
            return Verdict(cut_by, penalty=-self.overlong_penalty)
        penalty = 0.0
        if self.shapes_length:
            assert self.token_budget is not None
            length = max(end - start for start, end in trajectory.segments())
            penalty = self.overlong_penalty * overlong_shaping(length, self.token_budget, self.overlong_buffer)
        return Verdict(cut_by, masked=acts, penalty=penalty)


@dataclass
class TruncationCounts:
    """One step's trained episodes by the budget that cut them, and what the policy did to them."""

    episodes: int = 0
    """Episodes judged (the trainable ones)."""
    truncated: Counter[str] = field(default_factory=Counter)
    """By budget: episodes it cut short (whatever ``on_truncated``)."""
    masked: Counter[str] = field(default_factory=Counter)
    """By budget: episodes left out of the gradient."""
    penalised: Counter[str] = field(default_factory=Counter)
    """By budget: truncated episodes whose reward was lowered."""
    shaped: int = 0
    """Episodes no budget cut whose reward the length shaping lowered (they ended in the overlong buffer)."""
    penalty_sum: float = 0.0
    """Sum of the penalties added to the rewards (<= 0)."""

    def add(self, verdict: Verdict) -> None:
        self.episodes += 1
        if verdict.truncated_by is not None:
            self.truncated[verdict.truncated_by] += 1
            if verdict.masked:
                self.masked[verdict.truncated_by] += 1
            if verdict.penalty:
                self.penalised[verdict.truncated_by] += 1
        elif verdict.penalty:
            self.shaped += 1
        self.penalty_sum += verdict.penalty

    def metrics(self) -> dict[str, float]:
        """Flat, stable keys for a step's metrics (every budget present, 0 when none)."""
        out: dict[str, float] = {}
        for reason in TRUNCATED_BY:
            out[f"truncated_{reason}"] = self.truncated[reason]
            out[f"truncated_masked_{reason}"] = self.masked[reason]
            out[f"truncated_penalised_{reason}"] = self.penalised[reason]
        out["truncated_masked"] = sum(self.masked.values())
        out["truncated_penalised"] = sum(self.penalised.values())
        out["overlong_shaped"] = self.shaped
        out["overlong_penalty_mean"] = self.penalty_sum / self.episodes if self.episodes else 0.0
        return out
