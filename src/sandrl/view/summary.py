"""The run at a glance, for the viewer's page: its curves, its tasks and task sources, its episodes by status.

Built from what the run wrote (``metrics.jsonl`` and the episode index), so it is the same while
the run goes on and after. The curves are every number of each step's metrics line, plus what the
episodes say per step (episode time by phase) and what was measured beside the run (held-out
pass rates); the page offers them all and draws a few by default (:data:`PANELS`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from sandrl.view.episode_index import PHASES, EpisodeIndex
from sandrl.view.run_files import RunFiles

STATUS_FILTERS: dict[str, Callable[[str, bool | None], bool]] = {
    "passed": lambda status, passed: passed is True,
    "failed": lambda status, passed: passed is False,
    "truncated": lambda status, passed: status == "truncated",
    "agent_error": lambda status, passed: status == "agent_error",
    "infra_error": lambda status, passed: status == "infra_error",
}
"""The statuses the episode list filters by (an episode can be in more than one: passed and truncated)."""

PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Reward and pass rate", ("reward_mean", "pass_rate", "heldout/pass_rate")),
    ("Loss", ("train/loss",)),
    ("KL", ("train/kl_mean", "train/mismatch_kl")),
    ("Entropy", ("train/entropy_mean",)),
    ("Staleness", ("train/staleness_mean", "train/staleness_max")),
    ("Episode time by phase (s, mean)", ("time/setup_s", "time/model_s", "time/commands_s", "time/verifier_s")),
    ("Episodes per hour", ("episodes_per_hour",)),
    ("Tokens per second", ("tokens_per_s",)),
)
"""The charts drawn by default: a title and the series it shows (those the run has)."""
SOURCE_PANELS = (("pass_rate", "Pass rate by task source"), ("share", "Share of the groups by task source"))
"""The per-source charts of a run with ``[[tasks.sources]]``: the statistic and the chart's title."""
MAX_SOURCE_LINES = 8
MAX_BUCKETS = 24
"""Points of a task's pass rate over steps: steps are grouped into at most this many buckets."""


def summary(run: RunFiles) -> dict[str, Any]:
    """The page's overview of ``run`` (call :meth:`RunFiles.refresh` first)."""
    index = run.episodes
    steps_of = run.episode_steps()
    curves = _curves(run, index, steps_of)
    by_task = _groups(index, steps_of, index.task_id, len(run.metrics))
    by_source = _groups(index, steps_of, index.task_set, len(run.metrics))
    statuses = {name: 0 for name in STATUS_FILTERS}
    for status, passed in zip(index.status, index.passed, strict=True):
        for name, test in STATUS_FILTERS.items():
            statuses[name] += test(status, passed)
    last = run.metrics[-1] if run.metrics else {}
    config = run.config()
    return {
        "run": {
            "kind": run.kind,
            "name": run.directory.name,
            "directory": str(run.directory),
            "steps": len(run.metrics),
            "planned_steps": (config.get("run") or {}).get("steps") if isinstance(config.get("run"), dict) else None,
            "mode": last.get("mode"),
            "episodes": len(index),
            "unreadable": index.unreadable[:10],
            "unreadable_count": index.unreadable_count,
            "updated": last.get("time"),
        },
        "curves": curves,
        "panels": _panels(curves["series"]),
        "statuses": statuses,
        "tasks": by_task,
        "sources": by_source,
        "filters": {
            "steps": sorted({s for s in steps_of if s is not None}),
            "statuses": list(STATUS_FILTERS),
        },
        "results": _results(run.results()),
        "reports": run.reports(),
        "config": config,
    }


def _curves(run: RunFiles, index: EpisodeIndex, steps_of: Sequence[int | None]) -> dict[str, Any]:
    steps = [int(r.get("step", i + 1)) for i, r in enumerate(run.metrics)]
    position = {step: i for i, step in enumerate(steps)}
    series: dict[str, list[float | None]] = {}

    def put(key: str, i: int, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            return
        line = series.get(key)
        if line is None:
            line = series[key] = [None] * len(steps)
        line[i] = float(value)

    for i, record in enumerate(run.metrics):
        for key, value in record.items():
            if key not in ("step", "time"):
                put(key, i, value)
        seconds = record.get("step_s")
        done = _episodes_in_step(run.metrics, i)
        if done is not None and isinstance(seconds, int | float) and seconds > 0:
            put("episodes_per_hour", i, done / seconds * 3600)
    sums: dict[int, list[float]] = defaultdict(lambda: [0.0] * (len(PHASES) + 1))
    for n, step in enumerate(steps_of):
        if step is None or step not in position:
            continue
        row = sums[step]
        for j, column in enumerate(index.phases):
            row[j] += column[n]
        row[-1] += 1
    for step, row in sums.items():
        for j, phase in enumerate(PHASES):
            put(f"time/{phase}", position[step], row[j] / row[-1])
    heldout = [{"step": p["step"], "value": p["pass_rate"], "label": p["label"]} for p in run.heldout()]
    if heldout:
        series["heldout/pass_rate"] = [None] * len(steps)
    return {"steps": steps, "series": series, "points": {"heldout/pass_rate": heldout} if heldout else {}}


def _panels(series: dict[str, list[float | None]]) -> list[dict[str, Any]]:
    """The charts drawn by default: :data:`PANELS`, then one per statistic of a run that mixes
    task sources (``[[tasks.sources]]``: its ``source/<name>/<stat>`` curves, one line per source)."""
    panels = [{"title": title, "series": [s for s in keys if s in series]} for title, keys in PANELS]
    for stat, title in SOURCE_PANELS:
        keys = sorted(k for k in series if k.startswith("source/") and k.endswith(f"/{stat}"))
        if keys:
            panels.append({"title": title, "series": keys[:MAX_SOURCE_LINES]})
    return panels


def _episodes_in_step(metrics: Sequence[dict[str, Any]], i: int) -> float | None:
    total = metrics[i].get("total_episodes")
    if not isinstance(total, int | float):
        return None
    before = metrics[i - 1].get("total_episodes", 0) if i > 0 else 0
    return float(total - before) if isinstance(before, int | float) and total >= before else None


def _groups(
    index: EpisodeIndex, steps_of: Sequence[int | None], keys: Sequence[str], steps: int
) -> list[dict[str, Any]]:
    """Per value of ``keys`` (a task, a task source): counts, rates and the pass rate over steps."""
    width = max(1, math.ceil(steps / MAX_BUCKETS)) if steps else 1
    # [episodes, verified, passed, reward sum, retries, truncated, agent errors, infra errors], buckets
    counts: dict[str, list[float]] = {}
    buckets: dict[str, dict[int, list[int]]] = {}
    for key, status, passed, reward, attempt, step in zip(
        keys, index.status, index.passed, index.reward, index.attempt, steps_of, strict=True
    ):
        row = counts.get(key)
        if row is None:
            row = counts[key] = [0, 0, 0, 0.0, 0, 0, 0, 0]
            buckets[key] = {}
        row[0] += 1
        if attempt > 1:
            row[4] += attempt - 1
        if status != "completed":
            row[5] += status == "truncated"
            row[6] += status == "agent_error"
            row[7] += status == "infra_error"
        if passed is not None:
            row[1] += 1
            row[2] += passed
            bucket = buckets[key].setdefault((step - 1) // width if step is not None else 0, [0, 0])
            bucket[0] += passed
            bucket[1] += 1
        if reward is not None:
            row[3] += reward
    out: list[dict[str, Any]] = []
    for key, (episodes, verified, passed_n, reward_sum, retries, truncated, agent, infra) in counts.items():
        out.append(
            {
                "name": key,
                "episodes": int(episodes),
                "verified": int(verified),
                "passed": int(passed_n),
                "pass_rate": passed_n / verified if verified else None,
                "reward_mean": reward_sum / verified if verified else None,
                "retries": int(retries),
                "truncated": int(truncated),
                "agent_errors": int(agent),
                "infra_errors": int(infra),
                "over_steps": [
                    [b * width + 1, min(steps, (b + 1) * width) if steps else None, p / n]
                    for b, (p, n) in sorted(buckets[key].items())
                ],
            }
        )
    out.sort(key=lambda r: (-r["episodes"], r["name"]))
    return out


def _results(results: dict[str, Any] | None) -> dict[str, Any] | None:
    """An eval's headline numbers (the per-task table is the page's own, from the episodes)."""
    if not results:
        return None
    return {k: v for k, v in results.items() if isinstance(v, int | float | str | bool) or v is None}


def select(
    run: RunFiles,
    *,
    step: int | None = None,
    task: str | None = None,
    source: str | None = None,
    status: str | None = None,
    group: str | None = None,
) -> list[int]:
    """The episode numbers that match every filter given, in the file's order."""
    index = run.episodes
    steps_of = run.episode_steps() if step is not None else None
    test = STATUS_FILTERS.get(status) if status else None
    out = []
    for i in range(len(index)):
        if steps_of is not None and steps_of[i] != step:
            continue
        if task is not None and index.task_id[i] != task:
            continue
        if source is not None and index.task_set[i] != source:
            continue
        if group is not None and index.group_id[i] != group:
            continue
        if test is not None and not test(index.status[i], index.passed[i]):
            continue
        out.append(i)
    return out


def listing_row(run: RunFiles, i: int, steps_of: Sequence[int | None]) -> dict[str, Any]:
    """One line of the episode list (what the index does not hold is read from the episode's line)."""
    index = run.episodes
    head = index.head(i)
    return {
        "n": i,
        "episode_id": head["episode_id"],
        "group_id": index.group_id[i],
        "task_id": index.task_id[i],
        "task_set": index.task_set[i],
        "step": steps_of[i] if i < len(steps_of) else None,
        "status": index.status[i],
        "stop_reason": head["stop_reason"],
        "reward": index.reward[i],
        "passed": index.passed[i],
        "attempt": index.attempt[i],
        "total_s": round(index.phases[-1][i], 3),
        "error": head["error"],
    }
