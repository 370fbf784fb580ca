"""What a set of episodes came to: pass rate, status counts, phase-time percentiles, and why the
failed ones failed; as a dict and a table."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from sandrl.rollout.trajectory import STATUSES, Trajectory
from sandrl.stats import quantile

PHASES = (
    "queue_s",
    "sandbox_create_s",
    "setup_s",
    "model_s",
    "kv_wait_s",
    "command_s",
    "sandbox_wait_s",
    "verifier_s",
    "close_s",
    "total_s",
    "overhead_s",
)
"""The per-episode times summarised (``overhead_s``: total minus the phases the orchestrator waits on)."""


def _phase(t: Trajectory, name: str) -> float:
    return t.timings.overhead_s if name == "overhead_s" else float(getattr(t.timings, name))


def percentiles(values: Sequence[float]) -> dict[str, float]:
    return {
        "p50": round(quantile(values, 0.50), 4),
        "p90": round(quantile(values, 0.90), 4),
        "p99": round(quantile(values, 0.99), 4),
        "max": round(max(values), 4),
    }


def summarize(trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    """Counts and rates over episodes; the pass rate and mean reward are over verified episodes only."""
    statuses = Counter(t.status for t in trajectories)
    verified = [t for t in trajectories if t.reward is not None]
    total = sum(t.timings.total_s for t in trajectories)
    overhead = sum(t.timings.overhead_s for t in trajectories)
    errors = Counter(t.error.error_code for t in trajectories if t.error is not None)
    out: dict[str, Any] = {
        "episodes": len(trajectories),
        "status": {s: statuses.get(s, 0) for s in STATUSES},
        "verified": len(verified),
        "pass_rate": round(sum(bool(t.passed) for t in verified) / len(verified), 4) if verified else None,
        "mean_reward": round(sum(t.reward or 0.0 for t in verified) / len(verified), 4) if verified else None,
        "retries": sum(len(t.retried_errors) for t in trajectories),
        "errors": dict(errors.most_common()),
        "turns_mean": round(sum(t.num_turns for t in trajectories) / len(trajectories), 3) if trajectories else None,
        "overhead_share": round(overhead / total, 6) if total > 0 else None,
        "phases_s": {p: percentiles([_phase(t, p) for t in trajectories]) for p in PHASES} if trajectories else {},
    }
    forked = forked_groups(trajectories)
    if forked:
        out["forked_groups"] = forked
    return out


def forked_groups(trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    """With ``fork_groups``: how many groups were set up once, and what that took (each group counted
    once, not once per episode); empty when no episode was forked."""
    parents = {t.forked_from["parent"]: t.forked_from for t in trajectories if t.forked_from is not None}
    if not parents:
        return {}
    return {
        "groups": len(parents),
        "setup_s": percentiles([float(p["setup_s"]) for p in parents.values()]),
        "snapshot_s": percentiles([float(p["snapshot_s"]) for p in parents.values()]),
    }


def print_summary(summary: dict[str, Any], console: Console | None = None) -> None:
    """The summary for people: one line of counts, then a table of phase times."""
    out = console or Console(stderr=True)
    status = ", ".join(f"{k} {v}" for k, v in summary["status"].items())
    rate = summary["pass_rate"]
    out.print(
        f"[bold]{summary['episodes']} episodes[/bold]: {status}; "
        f"pass rate {'-' if rate is None else f'{rate:.1%}'} of {summary['verified']} verified; "
        f"{summary['retries']} retries"
    )
    if summary["errors"]:
        out.print("errors: " + ", ".join(f"{k} x{v}" for k, v in summary["errors"].items()), markup=False)
    if "forked_groups" in summary:
        f = summary["forked_groups"]
        out.print(
            f"forked groups: {f['groups']}, each set up once (setup p50 {f['setup_s']['p50']:.3f} s, "
            f"snapshot p50 {f['snapshot_s']['p50']:.3f} s); episodes started from the snapshot"
        )
    if "admission" in summary:
        a = summary["admission"]
        out.print(
            f"admission: {a['slots']} commands at once; {a['queued']} of {a['admitted']} commands queued "
            f"(mean wait {a['wait_s_mean']:.3f} s, longest {a['wait_s_max']:.3f} s)"
        )
    if "kv_admission" in summary:
        k = summary["kv_admission"]
        reports = {True: "", False: " (the engines report no KV capacity: none waited)", None: ""}[k["reports"]]
        out.print(
            f"KV admission: {k['waited']} of {k['calls']} model calls waited for the engines' room "
            f"({k['wait_s']:.3f} s in all, longest {k['longest_wait_s']:.3f} s; {k['readings']} readings, "
            f"{k['timeouts']} timed out){reports}"
        )
    table = Table(title="phase times (s)")
    table.add_column("phase")
    for column in ("p50", "p90", "p99", "max"):
        table.add_column(column, justify="right")
    for phase, values in summary["phases_s"].items():
        table.add_row(phase, *(f"{values[c]:.3f}" for c in ("p50", "p90", "p99", "max")))
    out.print(table)


TAIL_LINES = 5
"""Lines of the end of the verifier's output a failure shows."""


def verifier_tail(verifier: Mapping[str, Any], lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of the verifier's output, on one line (`` | `` between them)."""
    return " | ".join(str(verifier.get("stdout_tail") or "").strip().splitlines()[-lines:])


def verifier_error(verifier: Mapping[str, Any]) -> str | None:
    """Why the verifier gave no reward the way the task defines it, with the end of its output; None if it did."""
    error = verifier.get("error")
    if error is None:
        return None
    said = verifier_tail(verifier)
    return str(error) + (": " + said if said else "")


def failure_reason(t: Trajectory) -> str | None:
    """Why an episode did not pass, for people; None when it passed.

    The episode's error (an infra or agent failure: its message), else what the verifier said: its
    error, or its exit code and the last lines of its output (a plain failing test run).
    """
    if t.passed:
        return None
    broken = verifier_error(t.verifier)
    if broken is not None:
        return broken
    if t.error is not None:
        return f"{t.error.kind} error in {t.error.phase} ({t.error.error_code}): {t.error.message}"
    if not t.verifier:
        return "the verifier did not run"
    said = verifier_tail(t.verifier)
    return f"verifier exit {t.verifier.get('exit_code')}" + (f": {said}" if said else " and printed nothing")
