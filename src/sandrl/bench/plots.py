"""The report's figures as PNG bytes (matplotlib's Agg renderer, no pyplot, no global state).

Each function takes labelled benchmark results (``[(label, result_dict), ...]``) and returns
one PNG, or None when no result holds the data it draws.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from sandrl.bench.breakdown import PHASES
from sandrl.bench.workloads import CLASSES

Labelled = Sequence[tuple[str, dict[str, Any]]]
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


def _png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    fig.clear()
    return buf.getvalue()


def slowdown_vs_load(results: Labelled) -> bytes | None:
    """Per class: p50 (line) and p95 (dashed) slowdown against background load per core, the bar, capacity."""
    with_levels = [(label, r) for label, r in results if r.get("levels")]
    if not with_levels:
        return None
    classes = [c for c in (*CLASSES, "all") if any(c in lv["classes"] for _, r in with_levels for lv in r["levels"])]
    fig = Figure(figsize=(4.2 * len(classes), 3.8))
    axes = fig.subplots(1, len(classes), squeeze=False)[0]
    for ax, cls in zip(axes, classes, strict=True):
        for i, (label, r) in enumerate(with_levels):
            color = COLORS[i % len(COLORS)]
            cores = float(r["host"]["cores"])
            pts = [lv for lv in r["levels"] if cls in lv["classes"]]
            x = [lv["background"] / cores for lv in pts]
            ax.plot(x, [lv["classes"][cls]["p50"] for lv in pts], "o-", color=color, label=f"{label} p50")
            ax.plot(x, [lv["classes"][cls]["p95"] for lv in pts], "s--", color=color, alpha=0.6, label=f"{label} p95")
            cap = r["capacity"]["load"] if cls == "all" else r["capacity"]["per_class"].get(cls)
            if cap is not None:
                ax.axvline(cap / cores, color=color, linestyle=":", linewidth=1)
        for bar in sorted({float(r["capacity"]["bar"]) for _, r in with_levels}):
            ax.axhline(bar, color="black", linewidth=1.2, label=f"bar {bar:g}x")
        ax.set_title(f"{cls}" if cls != "all" else "all commands")
        ax.set_xlabel("background tasks per core")
        ax.set_ylabel("slowdown (time / standalone)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="upper left")
    fig.suptitle("Slowdown vs load (dotted: capacity)")
    return _png(fig)


def capacity_bars(results: Labelled) -> bytes | None:
    """Capacity per host: background tasks at the bar, and the same per core."""
    rows = [(label, r["capacity"], float(r["host"]["cores"])) for label, r in results if r.get("bench") == "contention"]
    if not rows:
        return None
    fig = Figure(figsize=(8, 3.2))
    ax1, ax2 = fig.subplots(1, 2)
    labels = [label for label, _, _ in rows]
    loads = [float(c["load"]) if c["load"] is not None else 0.0 for _, c, _ in rows]
    colors = [COLORS[i % len(COLORS)] for i in range(len(rows))]
    ax1.bar(labels, loads, color=colors)
    ax1.set_ylabel("background tasks")
    ax1.set_title("capacity")
    ax2.bar(labels, [load / cores for load, (_, _, cores) in zip(loads, rows, strict=True)], color=colors)
    ax2.set_ylabel("background tasks per core")
    ax2.set_title("capacity per core")
    for ax in (ax1, ax2):
        ax.tick_params(axis="x", labelsize=8)
    return _png(fig)


def breakdown_bars(results: Labelled) -> bytes | None:
    """The mean episode per host as stacked bars of its phases."""
    rows = [(label, r["episodes"]["mean"]) for label, r in results if r.get("episodes")]
    if not rows:
        return None
    fig = Figure(figsize=(8, 1.2 + 0.7 * len(rows)))
    ax = fig.subplots()
    left = [0.0] * len(rows)
    for j, phase in enumerate(PHASES):
        widths = [float(m[phase]) for _, m in rows]
        ax.barh([label for label, _ in rows], widths, left=left, color=COLORS[j % len(COLORS)], label=phase[:-2])
        left = [a + w for a, w in zip(left, widths, strict=True)]
    ax.set_xlabel("seconds (mean episode)")
    ax.legend(fontsize=8, ncols=len(PHASES), loc="lower center", bbox_to_anchor=(0.5, 1.0))
    return _png(fig)


def projection_curve(results: Labelled) -> bytes | None:
    """Episode time against inference speed-up k per host, and B/A when there are two."""
    rows = [(label, r["projection"]["points"]) for label, r in results if r.get("projection")]
    if not rows:
        return None
    fig = Figure(figsize=(9, 3.6))
    ax1, ax2 = fig.subplots(1, 2)
    for i, (label, pts) in enumerate(rows):
        ax1.plot([p["k"] for p in pts], [p["episode_s"] for p in pts], "o-", color=COLORS[i % len(COLORS)], label=label)
    ax1.set_xscale("log", base=2)
    ax1.set_xlabel("inference speed-up k")
    ax1.set_ylabel("episode seconds")
    ax1.legend(fontsize=8)
    ax1.grid(alpha=0.3)
    if len(rows) >= 2:
        a, b = rows[0][1], rows[1][1]
        ratio = [pb["episode_s"] / pa["episode_s"] for pa, pb in zip(a, b, strict=True)]
        ax2.plot([p["k"] for p in a], ratio, "o-", color="black")
        ax2.axhline(1.0, color="grey", linewidth=1)
        ax2.set_title(f"{rows[1][0]} / {rows[0][0]}", fontsize=9)
    else:
        ax2.plot([p["k"] for p in rows[0][1]], [p["sandbox_fraction"] for p in rows[0][1]], "o-", color="black")
        ax2.set_title("share of the episode outside the model", fontsize=9)
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel("inference speed-up k")
    ax2.grid(alpha=0.3)
    return _png(fig)


def admission_bars(results: Labelled) -> bytes | None:
    """Per admission result: p50 and p95 command slowdown of both ways against the bar, and episodes per hour."""
    rows = [(label, r) for label, r in results if r.get("bench") == "admission"]
    if not rows:
        return None
    fig = Figure(figsize=(10, 2.2 + 1.1 * len(rows)))
    ax1, ax2 = fig.subplots(1, 2, sharey=True)
    ways = (("admit_all", "admit all", COLORS[1]), ("capacity_aware", "capacity-aware", COLORS[0]))
    height = 0.38
    labels = [label for label, _ in rows]
    for j, (key, name, color) in enumerate(ways):
        y = [i + (j - 0.5) * height for i in range(len(rows))]
        p95 = [float(r[key]["slowdown"]["all"]["p95"]) for _, r in rows]
        p50 = [float(r[key]["slowdown"]["all"]["p50"]) for _, r in rows]
        ax1.barh(y, p95, height=height, color=color, alpha=0.45, label=f"{name} p95")
        ax1.barh(y, p50, height=height, color=color, label=f"{name} p50")
        ax2.barh(y, [float(r[key]["episodes_per_hour"] or 0) for _, r in rows], height=height, color=color, label=name)
    for bar in sorted({float(r["config"]["bar"]) for _, r in rows}):
        ax1.axvline(bar, color="black", linewidth=1.2, label=f"bar {bar:g}x")
    ax1.set_yticks(range(len(rows)), labels, fontsize=8)
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3, axis="x")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=3)
    ax1.set_xlabel("command slowdown (run time / standalone)")
    ax2.set_xlabel("episodes per hour")
    fig.suptitle("Admission at a multiple of the capacity")
    return _png(fig)
