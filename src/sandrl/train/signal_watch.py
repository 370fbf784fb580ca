"""Whether a run can learn at all: GRPO learns from the differences between a group's episodes.

A group whose episodes all got the same reward (all passed, or all failed) has no advantage and
is left out of the step (:func:`sandrl.train.batch.samples_from_groups`). A run where every group
is like that trains nothing, and used to say only ``trained 0/2 groups`` on every step, forever.
:class:`SignalWatch` says so on each such step and, after a few in a row, what to change.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sandrl.rollout.trajectory import Trajectory

__all__ = ["HINT_AFTER_STEPS", "SignalWatch", "split_no_signal"]

HINT_AFTER_STEPS = 3
"""Steps in a row without any reward signal before the run says what to change."""


def split_no_signal(groups: Sequence[Sequence[Trajectory]]) -> tuple[int, int]:
    """(all passed, all failed): the groups whose scored episodes all got one reward."""
    all_pass = all_fail = 0
    for group in groups:
        scored = [t for t in group if t.reward is not None]
        if not scored or len({t.reward for t in scored}) > 1:
            continue
        if all(t.passed for t in scored):
            all_pass += 1
        else:
            all_fail += 1
    return all_pass, all_fail


@dataclass
class SignalWatch:
    """Counts the steps in a row that trained no group; tells once per such streak what to do."""

    streak: int = 0

    def observe(self, groups_trained: int, all_pass: int, all_fail: int) -> tuple[str, str | None]:
        """(what the step's progress line adds, advice to print once, or None)."""
        if groups_trained > 0:
            self.streak = 0
            return "", None
        self.streak += 1
        suffix = f"  no reward signal: {all_fail} groups all failed, {all_pass} all passed"
        if self.streak != HINT_AFTER_STEPS:
            return suffix, None
        if all_fail >= all_pass:
            change = (
                "the tasks are too hard for this policy: start from a stronger or warm-started model "
                "([model] name; `sandrl demo` shows a warm start), use easier tasks ([tasks]), raise "
                "[rollout] group_size so that a rare success shows up, or give episodes more room "
                "([rollout] max_turns, max_total_tokens)"
            )
        else:
            change = "the tasks are too easy for this policy: use harder ones ([tasks])"
        advice = (
            f"{self.streak} steps in a row trained nothing: GRPO learns from differences between a "
            f"group's episodes, and every group's episodes got one reward. What to change: {change}."
        )
        return suffix, advice
