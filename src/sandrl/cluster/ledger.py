"""Exactly-once accounting of episodes across rollout workers that may die.

Every group the driver hands out is *issued* once under its id; its episodes' ids are
``<group id>/<sample index>`` whichever worker runs them. When a worker dies the group is
*re-issued* (same id, same episode ids) to another worker; when a group comes back it is
*delivered*, and only once: a group id, or an episode id, that was already delivered is refused
(:class:`~sandrl.errors.ClusterError`), so the trainer never sees an episode twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sandrl.errors import ClusterError
from sandrl.rollout.runner import Group


@dataclass
class EpisodeLedger:
    """See the module docstring."""

    issued: dict[str, int] = field(default_factory=dict)
    """Group id -> episodes it holds, for every group handed out."""
    delivered: set[str] = field(default_factory=set)
    """Episode ids handed to the session."""
    reissues: dict[str, int] = field(default_factory=dict)
    """Group id -> times it was re-issued after its worker died."""

    def issue(self, group_id: str, episodes: int) -> None:
        if group_id in self.issued:
            raise ClusterError(f"group {group_id} was already issued: a driver bug, two positions share an id")
        self.issued[group_id] = episodes

    def reissue(self, group_id: str) -> int:
        """Count a re-issue of ``group_id``; how many it has had."""
        self.reissues[group_id] = self.reissues.get(group_id, 0) + 1
        return self.reissues[group_id]

    def deliver(self, group: Group) -> None:
        """Accept ``group``, or raise if any of its episodes was delivered before."""
        if group.group_id not in self.issued:
            raise ClusterError(f"group {group.group_id} came back without being issued")
        ids = [t.episode_id for t in group.trajectories]
        seen = [i for i in ids if i in self.delivered]
        if seen or len(set(ids)) != len(ids):
            raise ClusterError(f"episodes delivered twice: {', '.join(seen) or ids}; refusing group {group.group_id}")
        wrong = [i for i in ids if not i.startswith(group.group_id + "/")]
        if wrong:
            raise ClusterError(f"episodes {', '.join(wrong)} do not belong to group {group.group_id}")
        self.delivered.update(ids)

    @property
    def outstanding(self) -> int:
        """Episodes issued and not yet delivered."""
        return sum(self.issued.values()) - len(self.delivered)

    def to_dict(self) -> dict[str, Any]:
        return {
            "groups_issued": len(self.issued),
            "episodes_issued": sum(self.issued.values()),
            "episodes_delivered": len(self.delivered),
            "groups_reissued": len(self.reissues),
            "reissues": sum(self.reissues.values()),
        }
