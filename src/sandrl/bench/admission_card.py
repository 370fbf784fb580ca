"""The admission benchmark's card: its rows as text, printed by the benchmark and shown by the report.

Apart from :mod:`sandrl.bench.admission` so that the HTML report (:mod:`sandrl.bench.report`)
renders an admission result without importing the benchmark (the runner, the sandboxes).
"""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.table import Table


def print_card(result: dict[str, Any], console: Console) -> None:
    host, cap, cfg = result["host"], result["capacity"], result["config"]
    table = Table(
        title=f"sandrl bench admission: {host['cpu_model']}, {host['cores']:g} cores "
        f"(limit: {host['host_limit']['mode']}); capacity {cap['slots']} commands at once ({cap['source']}); "
        f"{result['offered']['episodes_in_flight']} episodes in flight ({cfg['factor']:g}x: "
        f"{result['offered']['busy_sandboxes']:g} busy sandboxes at a duty of {result['offered']['duty']:.0%})",
        caption=f"slowdown: a command's run time / its standalone time; bar {cfg['bar']}x at {cfg['quantile']:.0%}; "
        "wait: the agent's wait per command (queueing included) / standalone",
    )
    for col in ("measure", "admit all (a)", "capacity-aware (b)", "b vs a"):
        table.add_column(col, justify="left" if col == "measure" else "right")
    for row in measure_rows(result):
        table.add_row(*row)
    console.print(table)
    claims = result["claims"]
    console.print(
        f"capacity-aware within the bar: {_yes(claims['capacity_aware_within_bar'])}; admit-all within: "
        f"{_yes(claims['admit_all_within_bar'])}; episodes/hour b >= a: {_yes(claims['episodes_per_hour_b_ge_a'])} "
        f"(b/a {result['ratios']['episodes_per_hour_b_over_a']}, per round "
        f"{result['ratios']['episodes_per_hour_b_over_a_per_round']}); took {result['duration_s']:.0f} s"
    )


def measure_rows(result: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(measure, admit all, capacity-aware, b vs a) as text: the card's table, and the HTML report's."""
    a, b, cfg = result["admit_all"], result["capacity_aware"], result["config"]
    rows: list[tuple[str, str, str, str]] = []

    def row(name: str, key: str, spec: str = ".2f", ratio: bool = False) -> None:
        va, vb = a.get(key), b.get(key)
        change = f"{vb / va:.2f}x" if ratio and va and vb is not None else ""
        rows.append((name, _f(va, spec), _f(vb, spec), change))

    row("episodes (verified)", "verified", "d")
    row("passed", "passed", "d")
    row("infra errors", "infra_errors", "d")
    row("wall s", "wall_s", ".1f", True)
    row("episodes per hour", "episodes_per_hour", ".0f", True)
    row("mean episode s", "episode_s_mean", ".2f", True)
    for q in ("p50", "p95", "max"):
        rows.append((
            f"command slowdown {q}", _f(a["slowdown"]["all"][q]), _f(b["slowdown"]["all"][q]),
            f"{b['slowdown']['all'][q] / a['slowdown']['all'][q]:.2f}x",
        ))  # fmt: skip
    rows.append(("commands within the bar", f"{a['within_bar']:.0%}", f"{b['within_bar']:.0%}", ""))
    rows.append(("passes the bar", _yes(a["passes_bar"]), _yes(b["passes_bar"]), ""))
    rows.append(("agent wait / standalone p95", _f(a["wait_slowdown"]["p95"]), _f(b["wait_slowdown"]["p95"]), ""))
    row("commands running (mean)", "commands_running_mean")
    row("CPUs busy (mean)", "cpu_busy_cores_mean")
    row("CPU s per episode", "cpu_s_per_episode", ".2f", True)
    row("commands that queued", "queued_fraction", ".0%")
    row("queue wait per command s", "queue_wait_s_mean", ".3f")
    rows.append(("most commands at once", "-", _f(b["peak_running"], "d"), ""))
    rows.append(("extras onto idle cores", "-", _f(b["extras"], "d") if cfg["fill_idle_cores"] else "off", ""))
    return rows


def _f(x: object, spec: str = ".2f") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, spec) if isinstance(x, int | float) else str(x)


def _yes(flag: object) -> str:
    return "yes" if flag else "no"
