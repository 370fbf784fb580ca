"""A step's sample episodes for a tracker's table: a few per step, each one's text bounded.

Everything an episode holds past its task id and numbers came from a model or a sandbox, and is
hostile: the conversation is cut to :data:`TEXT_CHARS` (its start and its end, where the answer is),
and every character that is not printable, but for newlines and tabs, is written as its escape
(``\\x1b``), so a terminal escape or a NUL reaches no tracker's page. The trackers' own pages
escape what they show as HTML.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sandrl.inference.tokenizer import Tokenizer
from sandrl.rollout.trajectory import Trajectory

EPISODES_PER_STEP = 4
"""Episodes of each step sent to the trackers (spread over the step's groups)."""
TEXT_CHARS = 4000
"""Characters of an episode's conversation kept: the first quarter from its start, the rest from its end."""
DECODED_IDS = 4 * TEXT_CHARS
"""Ids decoded from each end of an episode at most (a token is at least one character): decoding
stays bounded however long the episode."""
ID_CHARS = 200
"""Characters kept of an episode's and a task's id (both include names a task directory chose)."""
COLUMNS: tuple[str, ...] = ("step", "episode_id", "task", "reward", "passed", "status", "stop_reason", "tokens", "text")


@dataclass(frozen=True)
class EpisodeRow:
    """One sample episode as a table row (the fields in :data:`COLUMNS`' order)."""

    step: int
    episode_id: str
    task: str
    reward: float | None
    passed: bool | None
    status: str
    stop_reason: str
    tokens: int
    text: str
    """The decoded conversation, bounded; without a tokenizer, a line saying how many ids it has."""

    def values(self) -> list[Any]:
        return [getattr(self, f.name) for f in dataclasses.fields(self)]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def sample_episodes(
    step: int, trajectories: Sequence[Trajectory], tokenizer: Tokenizer | None, limit: int = EPISODES_PER_STEP
) -> list[EpisodeRow]:
    """Up to ``limit`` of the step's episodes, spread evenly over them (so over its groups), as rows."""
    if not trajectories or limit < 1:
        return []
    count = min(limit, len(trajectories))
    picked = [trajectories[i * len(trajectories) // count] for i in range(count)]
    return [_row(step, t, tokenizer) for t in picked]


def _row(step: int, t: Trajectory, tokenizer: Tokenizer | None) -> EpisodeRow:
    return EpisodeRow(
        step=step,
        episode_id=printable(t.episode_id)[:ID_CHARS],
        task=printable(t.task_id)[:ID_CHARS],
        reward=t.reward,
        passed=t.passed,
        status=t.status,
        stop_reason=t.stop_reason or "",
        tokens=len(t.ids),
        text=conversation(t.ids, tokenizer),
    )


def conversation(ids: Sequence[int], tokenizer: Tokenizer | None, limit: int = TEXT_CHARS) -> str:
    """``ids`` decoded and bounded to ``limit`` characters (its start and end); its length without a tokenizer."""
    if tokenizer is None:
        return f"({len(ids)} ids; no tokenizer at hand to decode them)"
    head_chars = limit // 4
    try:
        if len(ids) <= 2 * DECODED_IDS:
            text = tokenizer.decode(list(ids))
            head, tail = text[:head_chars], text[head_chars:]
        else:
            head = tokenizer.decode(list(ids[:DECODED_IDS]))[:head_chars]
            tail = tokenizer.decode(list(ids[-DECODED_IDS:]))
    except Exception as exc:  # ids a tokenizer cannot decode are the episode's problem, not the run's
        return f"({len(ids)} ids; not decodable: {type(exc).__name__})"
    # Escaped before being cut: an escape is longer than its character, and the bound is on what is shown.
    shown_head = printable(head, keep="\n\t")
    head_cut = shown_head[:head_chars]
    tail_chars = limit - len(head_cut)
    shown_tail = printable(tail[-tail_chars:], keep="\n\t")
    tail_cut = shown_tail[-tail_chars:]
    cut = len(ids) > 2 * DECODED_IDS or len(shown_head) > head_chars or len(tail) > tail_chars
    cut = cut or len(shown_tail) > tail_chars
    if cut:
        return f"{head_cut}\n[... {len(ids)} ids in all, cut here ...]\n{tail_cut}"
    return head_cut + tail_cut


def printable(text: str, keep: str = "") -> str:
    """``text`` with every character that is not printable (but those in ``keep``) written as its escape."""
    return "".join(c if c.isprintable() or c in keep else c.encode("unicode_escape").decode("ascii") for c in text)
