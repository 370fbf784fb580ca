"""What ``sandrl eval`` reports for research: pass@k per task, and the failures grouped by why.

pass@k is Chen et al. (2021)'s unbiased estimator: with ``n`` samples of a task of which ``c``
passed, ``1 - C(n-c, k) / C(n, k)``, the chance that at least one of ``k`` samples drawn without
replacement passes. It is reported for ``k = 1`` and ``k = n`` (the ``--samples`` given); a task's
episodes that ended without a reward (infra errors) count as not passed, since the run could not
show they pass.

Failure reasons are what a sandbox printed (the verifier's output tail) or an error message:
hostile text, bounded here and printed with markup off.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from math import comb
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from sandrl.rollout.summary import failure_reason
from sandrl.rollout.trajectory import Trajectory

REASON_CHARS = 300
"""Characters of a failure reason kept (a verifier can print anything, at any length)."""
REASONS_SHOWN = 15
"""Distinct failure reasons printed; the rest are counted."""


def shown_text(text: str) -> str:
    """``text`` on one line, at most :data:`REASON_CHARS` long, every character that is not printable
    written as its escape (``\\x1b``): a terminal escape a sandbox printed is shown, never obeyed."""
    one_line = " ".join(text.split())
    shown = "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in one_line[:REASON_CHARS]
    )
    if len(one_line) > REASON_CHARS or len(shown) > REASON_CHARS:
        return shown[: REASON_CHARS - 3] + "..."
    return shown


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al. (2021)'s unbiased pass@k from ``n`` samples of which ``c`` passed."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


@dataclass(frozen=True)
class TaskScore:
    """One task's episodes: how many, how many passed, how many had no reward, and pass@1 / pass@n."""

    task_id: str
    samples: int
    passed: int
    errors: int
    mean_reward: float | None
    pass_at_1: float
    pass_at_n: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task_id,
            "samples": self.samples,
            "passed": self.passed,
            "errors": self.errors,
            "mean_reward": self.mean_reward,
            "pass@1": round(self.pass_at_1, 6),
            f"pass@{self.samples}": round(self.pass_at_n, 6),
        }


@dataclass(frozen=True)
class FailureGroup:
    """Episodes that did not pass for the same reason: how many, and on which tasks."""

    reason: str
    episodes: int
    tasks: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"reason": self.reason, "episodes": self.episodes, "tasks": list(self.tasks)}


def task_scores(trajectories: Sequence[Trajectory]) -> list[TaskScore]:
    """Per task (by name): the samples, passes, and pass@1 / pass@n over them."""
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        by_task[t.task_id].append(t)
    scores = []
    for task_id in sorted(by_task):
        episodes = by_task[task_id]
        n = len(episodes)
        c = sum(bool(t.passed) for t in episodes)
        rewards = [t.reward for t in episodes if t.reward is not None]
        scores.append(
            TaskScore(
                task_id=task_id,
                samples=n,
                passed=c,
                errors=n - len(rewards),
                mean_reward=round(sum(rewards) / len(rewards), 4) if rewards else None,
                pass_at_1=pass_at_k(n, c, 1),
                pass_at_n=pass_at_k(n, c, n),
            )
        )
    return scores


def mean_pass_at(scores: Sequence[TaskScore]) -> dict[str, float | None]:
    """pass@1 and pass@n averaged over tasks (each task weighs the same, whatever its sample count)."""
    if not scores:
        return {"pass@1": None, "pass@n": None}
    return {
        "pass@1": round(sum(s.pass_at_1 for s in scores) / len(scores), 6),
        "pass@n": round(sum(s.pass_at_n for s in scores) / len(scores), 6),
    }


def failure_groups(trajectories: Sequence[Trajectory]) -> list[FailureGroup]:
    """The episodes that did not pass, grouped by their reason (bounded), the most frequent first."""
    counts: Counter[str] = Counter()
    tasks: dict[str, set[str]] = defaultdict(set)
    for t in trajectories:
        reason = failure_reason(t)
        if reason is None:
            continue
        reason = shown_text(reason)
        counts[reason] += 1
        tasks[reason].add(t.task_id)
    return [FailureGroup(r, n, tuple(sorted(tasks[r]))) for r, n in counts.most_common()]


def report(trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    """The per-task scores, their means and the grouped failures, as JSON-ready data."""
    scores = task_scores(trajectories)
    return {
        "tasks": [s.to_dict() for s in scores],
        "mean": mean_pass_at(scores),
        "failures": [g.to_dict() for g in failure_groups(trajectories)],
    }


def print_report(trajectories: Sequence[Trajectory], console: Console) -> None:
    """The per-task table with pass@1 and pass@n, their means, then each failure reason with its count."""
    scores = task_scores(trajectories)
    if not scores:
        return
    ns = sorted({s.samples for s in scores})
    columns = ["samples", "passed", "errors", "mean reward", "pass@1"]
    if ns != [1]:  # pass@n is pass@1 when every task has one sample
        columns.append(f"pass@{ns[0]}" if len(ns) == 1 else "pass@n")
    table = Table(title="per task")
    table.add_column("task")
    for column in columns:
        table.add_column(column, justify="right")
    for s in scores:
        cells = [
            str(s.samples),
            str(s.passed),
            str(s.errors),
            "-" if s.mean_reward is None else f"{s.mean_reward:.3f}",
            f"{s.pass_at_1:.3f}",
            f"{s.pass_at_n:.3f}",
        ]
        table.add_row(escape(shown_text(s.task_id)), *cells[: len(columns)])
    mean = mean_pass_at(scores)
    table.add_section()
    means = ["", "", "", "", f"{mean['pass@1']:.3f}", f"{mean['pass@n']:.3f}"]
    table.add_row(f"mean of {len(scores)} tasks", *means[: len(columns)])
    console.print(table)
    groups = failure_groups(trajectories)
    if not groups:
        return
    failed = sum(g.episodes for g in groups)
    reasons = f"{len(groups)} distinct reason{'s' if len(groups) > 1 else ''}"
    console.print(f"{failed} episodes did not pass, for {reasons}:", highlight=False)
    for g in groups[:REASONS_SHOWN]:
        more = f" and {len(g.tasks) - 3} more" if len(g.tasks) > 3 else ""
        shown = ", ".join(shown_text(t) for t in g.tasks[:3]) + more
        console.print(
            f"  x{g.episodes} ({len(g.tasks)} task{'s' if len(g.tasks) > 1 else ''}: {shown}): {g.reason}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    if len(groups) > REASONS_SHOWN:
        console.print(f"  ... and {len(groups) - REASONS_SHOWN} more reasons (the results file has them all)")
