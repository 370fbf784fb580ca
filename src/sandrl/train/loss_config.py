"""The loss's settings, ``[train.loss]`` and ``[train.loss.is]``: checked when a config is read, without PyTorch.

What each option computes is in :mod:`sandrl.train.losses` (aggregation, KL),
:mod:`sandrl.train.estimators` (``estimator``), :mod:`sandrl.train.advantages` (``advantage``) and
:mod:`sandrl.train.importance` (``[train.loss.is]``); ``docs/guide/learning-signal.md`` explains
when to use which. Reading a run config (``sandrl train --plan``, a bad key) never imports PyTorch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from sandrl.errors import ConfigError

Level = Literal["token", "sequence", "geometric"]
Mode = Literal["truncate", "mask"]


@dataclass(frozen=True)
class ImportanceConfig:
    """``[train.loss.is]``: importance sampling between the sampling engine and the trainer (see
    :mod:`sandrl.train.importance`). Absent, ``tis_cap`` decides: ``tis_cap = 2`` is this table with
    its defaults, ``tis_cap = false`` turns importance sampling off."""

    level: Level = "token"
    """What a ratio is measured on: ``token`` (each token's ``exp(old - rollout)``), ``sequence`` (a
    sample's product of them) or ``geometric`` (their geometric mean over the sample's model tokens)."""
    mode: Mode = "truncate"
    """``truncate``: the weight is clamped into ``band`` (TIS); ``mask``: a token (``token`` level) or a
    whole sample (``sequence``, ``geometric``) whose ratio leaves ``band`` leaves the loss (MIS, IcePop)."""
    band: tuple[float, float] = (0.0, 2.0)
    """``[low, high]``, with ``0 <= low <= 1 <= high`` (an on-policy token, ratio 1, is always inside).
    Truncation clamps to it (``low = 0``: only above, as ``tis_cap``); masking keeps what lies in it
    (``[0.5, 2]`` is usual; IcePop uses ``[0.5, 5]``)."""

    def __post_init__(self) -> None:
        if self.level not in ("token", "sequence", "geometric"):
            raise ConfigError(f"level must be 'token', 'sequence' or 'geometric', got {self.level!r}")
        if self.mode not in ("truncate", "mask"):
            raise ConfigError(f"mode must be 'truncate' or 'mask', got {self.mode!r}")
        band = tuple(self.band)
        if len(band) != 2 or not all(isinstance(x, int | float) and math.isfinite(x) for x in band):
            raise ConfigError(f"band must be two finite numbers [low, high], e.g. [0.5, 2.0]; got {list(band)!r}")
        low, high = float(band[0]), float(band[1])
        object.__setattr__(self, "band", (low, high))
        if high <= 0:
            raise ConfigError(f"band's high must be > 0 (the largest ratio kept), got {high}")
        if low > high:
            raise ConfigError(f"band's low ({low}) is above its high ({high}); write it [low, high]")
        if low < 0 or low > 1 or high < 1:
            raise ConfigError(
                f"band [{low}, {high}] must hold 1, the ratio of a token the engine and the trainer agree on "
                "(0 <= low <= 1 <= high), or it would cut every on-policy token"
            )


LossType = Literal["grpo", "dr_grpo", "dapo"]
ScaleRewards = Literal["group", "batch", "none"]
Estimator = Literal["ppo", "gspo", "cispo"]
Advantage = Literal["grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"]

TIS_CAP = 2.0
"""``tis_cap``'s default: beside a ``[train.loss.is]`` table it is taken as not given."""


@dataclass(frozen=True)
class LossConfig:
    """The policy loss: its estimator, aggregation, clipping, advantages, KL and importance correction."""

    loss_type: LossType = "grpo"
    """How token losses become the batch loss.

    - ``grpo``: the mean over each sample's model tokens, then the mean over samples (GRPO,
      arXiv:2402.03300). Long answers weigh less per token, which Dr. GRPO shows biases the
      policy towards long wrong answers.
    - ``dr_grpo``: the sum over tokens divided by ``samples * max_tokens``, a constant, so no
      length bias (Dr. GRPO, arXiv:2503.20783).
    - ``dapo``: the sum over all model tokens of the batch divided by their number: every token
      weighs the same (DAPO's token-level policy gradient loss, arXiv:2503.14476).
    """
    estimator: Estimator = "ppo"
    """The policy-gradient estimator of each token (:mod:`sandrl.train.estimators`).

    - ``ppo``: PPO's clipped token ratio, as GRPO and DAPO use it (arXiv:1707.06347).
    - ``gspo``: one ratio per sample, the geometric mean of its token ratios, clipped per sample
      (GSPO, arXiv:2507.18071): steadier on long samples and mixture-of-experts models. Its ratio
      stays near 1: the paper clips at ``epsilon_low = 3e-4``, ``epsilon_high = 4e-4``. Importance
      sampling, if on, must be per sequence (``[train.loss.is] level``).
    - ``cispo``: the clipped ratio as a stop-gradient weight on ``A * logp``, so no token loses its
      gradient (CISPO, MiniMax-M1, arXiv:2506.13585); pairs with ``loss_type = "dapo"``.
    """
    epsilon_low: float = 0.2
    """Lower clip range: the ratio is clipped below at ``1 - epsilon_low`` (PPO, arXiv:1707.06347)."""
    epsilon_high: float = 0.2
    """Upper clip range: the ratio is clipped above at ``1 + epsilon_high``. DAPO's *clip-higher*
    raises it to 0.28 so that unlikely tokens can gain probability and entropy does not collapse
    (arXiv:2503.14476). Clipping only acts when a batch is split into several updates
    (``TrainConfig.minibatches > 1``) or the proximal policy differs from the current one."""
    advantage: Advantage = "grpo"
    """How rewards become advantages (:mod:`sandrl.train.advantages`).

    - ``grpo``: each reward minus its group's mean, scaled as ``scale_rewards`` says (arXiv:2402.03300).
    - ``rloo``: each reward minus the mean of the *other* rewards of its group, an unbiased baseline
      (RLOO, arXiv:2402.14740); also scaled as ``scale_rewards`` says: the paper's is ``"none"``.
    - ``reinforce_pp``: the batch's mean as the baseline and its standard deviation as the scale,
      over every model token (REINFORCE++, arXiv:2501.03262); a group whose rewards are all equal
      still carries signal against the batch and is trained.
    - ``reinforce_pp_baseline``: the group's mean subtracted, then divided by the batch's standard
      deviation (REINFORCE++-baseline, arXiv:2501.03262).

    The REINFORCE++ ones scale by the batch themselves: ``scale_rewards = "none"`` beside them is refused.
    """
    scale_rewards: ScaleRewards = "group"
    """How group-centred rewards are scaled into advantages ``A = (r - baseline) / scale``
    (``advantage = "grpo"`` or ``"rloo"``).

    - ``group``: by the standard deviation of the group (GRPO, arXiv:2402.03300).
    - ``batch``: by the standard deviation of all rewards in the batch (arXiv:2508.08221, which finds
      it more robust than the per-group one).
    - ``none``: not at all; Dr. GRPO shows the per-group std over-weights groups that are nearly all
      right or all wrong (arXiv:2503.20783).
    """
    max_tokens: int | None = None
    """Dr. GRPO's constant: the model-token budget of one sample. None: the most model tokens of any
    sample in the batch. Only ``loss_type = "dr_grpo"`` reads it."""
    beta: float = 0.0
    """Weight of the KL penalty to the reference (initial) policy, estimated per token with Schulman's
    k3 estimator as in GRPO (arXiv:2402.03300). 0 disables it and the trainer keeps no reference model
    (as DAPO and Dr. GRPO recommend for verifiable rewards)."""
    tis_cap: float | None = TIS_CAP
    """Truncated importance sampling: each token's loss is multiplied by
    ``min(p_trainer / p_rollout, tis_cap)``, which corrects for a stale rollout policy and for
    inference/trainer numeric mismatch while bounding the variance (Yao et al. 2025,
    https://fengyao.notion.site/off-policy-rl). None disables it; the samples then need no
    rollout log-probs. The shorthand of ``[train.loss.is]`` with ``level = "token"``,
    ``mode = "truncate"``, ``band = [0, tis_cap]``: with that table, leave it out (or say the same)."""
    importance: ImportanceConfig | None = field(default=None, metadata={"toml": "is"})
    """``[train.loss.is]``: importance sampling per token, per sequence or by geometric mean, truncated
    or masked (:mod:`sandrl.train.importance`). Absent: as ``tis_cap`` says."""
    advantage_epsilon: float = 1e-4
    """Added to the standard deviation before dividing, so a near-constant group stays finite."""
    entropy_coef: float = 0.0
    """An entropy bonus: ``entropy_coef`` times each model token's entropy (of the policy's whole
    next-token distribution, from the same chunked pass as the log-probs) is subtracted from its
    loss, aggregated as ``loss_type`` says. It keeps exploration up where entropy collapses (the
    PPO paper's entropy term, arXiv:1707.06347; DAPO prefers clip-higher, arXiv:2503.14476).
    Small values (1e-3) are usual; 0 adds no term, and the entropy is still reported
    (``entropy_mean``)."""

    def __post_init__(self) -> None:
        if self.loss_type not in ("grpo", "dr_grpo", "dapo"):
            raise ConfigError(f"loss_type must be 'grpo', 'dr_grpo' or 'dapo', got {self.loss_type!r}")
        if self.estimator not in ("ppo", "gspo", "cispo"):
            raise ConfigError(f"estimator must be 'ppo', 'gspo' or 'cispo', got {self.estimator!r}")
        if self.advantage not in ("grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"):
            raise ConfigError(
                f"advantage must be 'grpo', 'rloo', 'reinforce_pp' or 'reinforce_pp_baseline', got {self.advantage!r}"
            )
        if self.scale_rewards not in ("group", "batch", "none"):
            raise ConfigError(f"scale_rewards must be 'group', 'batch' or 'none', got {self.scale_rewards!r}")
        for name in ("epsilon_low", "epsilon_high"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ConfigError(f"{name} must be a finite number >= 0 (0.2 is usual), got {value!r}")
        if self.epsilon_low >= 1:
            raise ConfigError(
                f"epsilon_low must be < 1 (the ratio is clipped at 1 - epsilon_low), got {self.epsilon_low}"
            )
        if not math.isfinite(self.beta) or self.beta < 0:
            raise ConfigError(f"beta (the KL weight) must be a finite number >= 0, got {self.beta!r}")
        if self.tis_cap is not None and (not math.isfinite(self.tis_cap) or self.tis_cap < 1):
            raise ConfigError(
                f"tis_cap must be a number >= 1 (2 is usual), or absent to disable importance sampling; "
                f"got {self.tis_cap!r}"
            )
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be >= 1, or absent to use the longest sample; got {self.max_tokens}")
        if not math.isfinite(self.advantage_epsilon) or self.advantage_epsilon < 0:
            raise ConfigError(f"advantage_epsilon must be a finite number >= 0, got {self.advantage_epsilon!r}")
        if not math.isfinite(self.entropy_coef) or self.entropy_coef < 0:
            raise ConfigError(f"entropy_coef must be a finite number >= 0 (1e-3 is usual), got {self.entropy_coef!r}")
        self._check_together()

    def _check_together(self) -> None:
        """Settings that contradict each other, each refused with the fix."""
        if self.importance is not None and self.tis_cap is None:
            raise ConfigError(
                "tis_cap = false turns importance sampling off but [train.loss.is] turns it on: remove one of them"
            )
        if (
            self.importance is not None
            and self.tis_cap is not None
            and self.tis_cap != TIS_CAP
            and self.importance != ImportanceConfig(band=(0.0, self.tis_cap))
        ):
            raise ConfigError(
                f'tis_cap = {self.tis_cap} means [train.loss.is] level = "token", mode = "truncate", '
                f"band = [0, {self.tis_cap}], which the [train.loss.is] table contradicts: remove tis_cap"
            )
        sampling = self.importance_sampling
        if self.estimator == "gspo" and sampling is not None and sampling.level == "token":
            shorthand = f" (tis_cap = {self.tis_cap}, the default)" if self.importance is None else ""
            raise ConfigError(
                f'estimator = "gspo" weighs whole sequences but importance sampling is per token{shorthand}: '
                'set [train.loss.is] level = "geometric" (or "sequence"), or tis_cap = false'
            )
        if self.advantage in ("reinforce_pp", "reinforce_pp_baseline") and self.scale_rewards == "none":
            raise ConfigError(
                f'advantage = "{self.advantage}" divides by the batch\'s standard deviation, which '
                'scale_rewards = "none" contradicts: remove scale_rewards, or use advantage = "grpo" or "rloo"'
            )

    @property
    def importance_sampling(self) -> ImportanceConfig | None:
        """The importance sampling in effect: ``[train.loss.is]``, else ``tis_cap``'s token truncation, else None."""
        if self.importance is not None:
            return self.importance
        return None if self.tis_cap is None else ImportanceConfig(band=(0.0, self.tis_cap))
