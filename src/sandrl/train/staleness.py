"""Staleness judged by the version of every sampled token, not by one version per episode.

A trajectory that a weight update split (``in_place`` or ``abort_and_resume``, see
:mod:`sandrl.inference.engine`) holds tokens of two versions or more; so does a multi-turn
episode whose turns straddle an update. Its per-token record is
:meth:`~sandrl.rollout.trajectory.Trajectory.token_weight_versions`.

- **The bound** (``async.max_staleness``) holds for every trained token: a group is as stale as
  the oldest model token in it (:func:`staleness`). The trajectory's own ``weight_version`` (the
  oldest any turn *started* on) also counts, so a backend that does not say which token came from
  which weights (a turn recorded only by its first and last version) is judged conservatively.
- **The accounting** is per token as well: :func:`token_staleness_hist` counts the trained model
  tokens by how many versions behind the trainer they were sampled, which is what the importance
  ratio corrects, and :func:`mixed_version` flags the trajectories an update split. A histogram per
  trajectory (``staleness_hist``) would count a rollout that ran 900 tokens on fresh weights
  and 10 on old ones as wholly old.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

from sandrl.rollout.runner import Group
from sandrl.rollout.trajectory import Trajectory


def model_token_versions(trajectory: Trajectory) -> list[int]:
    """The known weight version of each of the trajectory's model tokens (loss mask 1), in order."""
    versions = trajectory.token_weight_versions()
    return [v for v, m in zip(versions, trajectory.loss_mask, strict=True) if m and v is not None]


def oldest_version(trajectory: Trajectory) -> int | None:
    """The oldest weights any of its tokens came from (None: no model token, no version)."""
    known = model_token_versions(trajectory)
    if trajectory.weight_version is not None:
        known.append(trajectory.weight_version)
    return min(known) if known else None


def group_version(group: Group) -> int | None:
    """The oldest weight version any token of the group came from (None: no model tokens)."""
    versions = [v for v in (oldest_version(t) for t in group.trajectories) if v is not None]
    return min(versions) if versions else None


def staleness(group: Group, version: int) -> int:
    """How many versions behind ``version`` the group's oldest token is (0 without a version)."""
    oldest = group_version(group)
    return 0 if oldest is None else version - oldest


def mixed_version(trajectory: Trajectory) -> bool:
    """Whether its model tokens come from more than one version of the weights."""
    return len(set(model_token_versions(trajectory))) > 1


def token_staleness_hist(trajectories: Iterable[Trajectory], version: int) -> dict[str, int]:
    """Model tokens counted by their staleness against ``version`` (keys as strings, for JSON)."""
    counts: collections.Counter[int] = collections.Counter()
    for trajectory in trajectories:
        counts.update(version - v for v in model_token_versions(trajectory))
    return {str(k): n for k, n in sorted(counts.items())}
