"""Benchmark results: render the HTML page, compare two hosts side by side.

The files are read by :func:`sandrl.result_file.load_result`, which says what each kind holds:
a contention result (``bench: contention``), an episode result (``bench: episodes``,
:mod:`sandrl.bench.episodes`: ``episodes`` is :func:`sandrl.bench.breakdown.episodes_section`,
``projection`` :func:`sandrl.bench.projection.projection_section`) or an admission one.
Everything here reads those keys and skips what a result does not have.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from sandrl.bench import plots, projection
from sandrl.bench.admission_card import measure_rows
from sandrl.bench.breakdown import EpisodeBreakdown
from sandrl.bench.workloads import CLASSES
from sandrl.errors import ConfigError
from sandrl.result_file import load_result

Labelled = Sequence[tuple[str, dict[str, Any]]]


def label_for(path: Path | str, result: dict[str, Any]) -> str:
    return f"{Path(path).stem} ({float(result['host']['cores']):g} cores)"


def load_labelled(paths: Sequence[Path | str]) -> list[tuple[str, dict[str, Any]]]:
    return [(label_for(p, r), r) for p, r in ((p, load_result(p)) for p in paths)]


# -- HTML


def _table(head: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    th = "".join(f"<th>{html.escape(str(h))}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _img(name: str, png: bytes | None, alt: str) -> str:
    if png is None:
        return f'<p class="missing" id="plot-{name}">{html.escape(alt)}: no result holds this data.</p>'
    data = base64.b64encode(png).decode()
    src = f"data:image/png;base64,{data}"
    return f'<figure><img id="plot-{name}" class="plot" alt="{html.escape(alt)}" src="{src}"></figure>'


def _fmt(x: object, spec: str = ".2f") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, spec) if isinstance(x, int | float) else str(x)


SEED_SOURCE = "the seed's figures as issue #26 quotes them; what the repository does not hold is marked not published"
SEED_FIGURES: tuple[tuple[str, str, str, str], ...] = (
    (
        "per-core slowdown at full load",
        "median slowdown (time / standalone) of each class with every core busy (cores - 1 background tasks and "
        "the probe), as a percentage over 1",
        "5-22%",
        "40-70%",
    ),
    (
        "capacity within the latency bar",
        "most background tasks with at least 95% of the probe commands within 1.5x standalone",
        "not published",
        "not published",
    ),
    (
        "sandbox share of an episode",
        "(episode - model time) / episode, the mean episode of the replayed built-in tasks",
        "not published",
        "not published",
    ),
    ("idle KV fraction", "KV token-seconds held idle while commands run / all", "not published", "not published"),
    (
        "host B / host A episode time at 8x faster inference",
        "the projection T(k) = model / k + rest, ratio of the two hosts",
        "not published",
        "not published",
    ),
)
"""(measure, definition, Vera, Turin): the seed's two hosts, by the names the seed gives them."""


def _cap(load: int | None) -> str:
    """A capacity for people: ``none`` when even the idle host failed the bar."""
    return "none" if load is None else str(load)


def seed_rows(results: Labelled) -> list[list[object]]:
    """The seed's published figures beside this run's, measure by measure (same definitions)."""
    contended = [(label, r) for label, r in results if r["bench"] == "contention"]
    rows: list[list[object]] = []
    ratio = "-"
    if len(contended) >= 2:
        ea, eb = _mean(contended[0][1]), _mean(contended[1][1])
        if ea is not None and eb is not None:
            ratio = f"{projection.host_ratio(ea, eb, (8,))[0]['ratio']:.2f}x"
    for measure, definition, vera, turin in SEED_FIGURES:
        ours = []
        for _, r in contended:
            if measure.startswith("per-core"):
                per_core = r["full_load"].get("per_core_slowdown") or {}
                ours.append(", ".join(f"{c} {(v - 1) * 100:+.0f}%" for c, v in per_core.items()) or "-")
            elif measure.startswith("capacity"):
                cap = r["capacity"]
                iv = cap.get("interval") or {}
                bracket = f" (90%: {_cap(iv.get('low'))}-{_cap(iv.get('high'))})" if iv else ""
                ours.append(f"{_cap(cap['load'])}{bracket}")
            elif measure.startswith("sandbox share"):
                e = _mean(r)
                ours.append(f"{(e.total_s - e.model_s) / e.total_s:.0%}" if e is not None and e.total_s > 0 else "-")
            elif measure.startswith("idle KV"):
                e = _mean(r)
                ours.append(f"{e.kv.idle_fraction:.1%}" if e is not None and e.kv is not None else "-")
            else:
                ours.append(ratio if ours else "reference")
        rows.append([measure, definition, vera, turin, *ours])
    return rows


CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px}
table{border-collapse:collapse;margin:0.5em 0 1.5em}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3}img.plot{max-width:100%}h2{border-bottom:1px solid #ddd}"""


def render_html(results: Labelled, study: dict[str, Any] | None = None) -> str:
    """The report page: hosts, the seed's figures beside this run's, capacity, per-level tables, the
    plots, the projection's assumptions (and, from ``sandrl bench study``, what ran and how long)."""
    if not results:
        raise ConfigError("give at least one result file")
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>sandrl sandbox-CPU benchmark</title>"]
    parts.append(f"<style>{CSS}</style></head><body><h1>sandrl sandbox-CPU benchmark</h1>")
    if study is not None:
        parts.append(_study_section(study))
    keys = ("cpu_model", "cores", "machine_cpus", "memory_mib", "kernel", "sandbox_backend", "cgroup_version")
    parts.append("<h2>Hosts</h2>")
    parts.append(
        _table(
            ["result", *keys, "host limit", "run s"],
            [
                [label, *(r["host"].get(k) for k in keys), r["host"]["host_limit"]["mode"], r.get("duration_s")]
                for label, r in results
            ],
        )
    )
    contended = [label for label, r in results if r["bench"] == "contention"]
    if contended:
        parts.append("<h2 id='seed'>The seed's published figures and this run's</h2>")
        parts.append(f"<p>Same definitions on both sides; {html.escape(SEED_SOURCE)}.</p>")
        parts.append(
            _table(
                ["measure", "definition", "seed: Vera", "seed: Turin", *(f"this run: {c}" for c in contended)],
                seed_rows(results),
            )
        )
    parts.append("<h2>Capacity and per-core slowdown</h2>")
    cap_rows = []
    for label, r in results:
        if r["bench"] != "contention":
            continue
        cap, full = r["capacity"], r["full_load"]
        per_core = full.get("per_core_slowdown") or {}
        iv = cap.get("interval") or {}
        idle = next((lv for lv in r["levels"] if lv["background"] == 0), None)
        share = (idle or {}).get("share")
        cap_rows.append(
            [
                label,
                f"{cap['bar']:g}x at {cap['quantile']:.0%}",
                _cap(cap["load"]),
                cap["bound"],
                f"{_cap(iv.get('low'))}-{_cap(iv.get('high'))}" if iv else "-",
                f"{share['within']}/{share['n']}" if share else "-",
                _fmt(cap["per_core"]),
                *(_fmt(per_core.get(c)) for c in CLASSES),
                cap.get("diagnosis") or full.get("explanation") or "",
            ]
        )
    parts.append(
        "<p>Capacity: the most background tasks at which at least the quantile of the probe commands finished "
        "within the bar (times their standalone time). Full load: cores - 1 background tasks plus the probe, "
        "every core busy; per-core slowdown is the median slowdown there.</p>"
    )
    parts.append(
        _table(
            [
                "result",
                "bar",
                "capacity",
                "bound",
                "90% interval",
                "idle within",
                "per core",
                *(f"{c} per-core slowdown" for c in CLASSES),
                "diagnosis",
            ],
            cap_rows,
        )
    )
    parts.append(_img("slowdown", plots.slowdown_vs_load(results), "slowdown vs load per class"))
    parts.append(_img("capacity", plots.capacity_bars(results), "capacity per host"))
    parts.append("<h2>Levels</h2>")
    for label, r in results:
        if not r.get("levels"):
            continue
        rows = []
        for lv in r["levels"]:
            cells: list[object] = [lv["background"], lv["source"], _fmt(lv["load_per_core"])]
            for c in CLASSES:
                s = lv["classes"].get(c)
                cells += [f"{s['p50']:.2f} / {s['p95']:.2f}", f"{s['within_bar']:.0%}"] if s else ["-", "-"]
            cells += [_fmt(lv["cpu_utilization"], ".0%"), "yes" if lv["passed"] else "no"]
            rows.append(cells)
        head = ["background", "source", "per core"]
        for c in CLASSES:
            head += [f"{c} p50 / p95", f"{c} in bar"]
        parts.append(f"<h3>{html.escape(label)}</h3>" + _table([*head, "cpu busy", "pass"], rows))
    parts.append("<h2>Episodes</h2>")
    parts.append(_img("breakdown", plots.breakdown_bars(results), "episode breakdown"))
    parts.append(_img("projection", plots.projection_curve(results), "projection for faster inference"))
    parts.append("<h3>Projection model: assumptions</h3><ul>")
    parts += [f"<li>{html.escape(a)}</li>" for a in projection.ASSUMPTIONS]
    parts.append("</ul>")
    admitted = [(label, r) for label, r in results if r["bench"] == "admission"]
    if admitted:
        parts.append("<h2>Admission at a multiple of the capacity</h2>")
        parts.append(
            "<p>The same episodes two ways: every command run when issued (a), or at most the host's capacity "
            "of commands at once, the rest queued (b). Slowdown: a command's run time over its standalone time; "
            "agent wait: the same with the queueing.</p>"
        )
        for label, r in admitted:
            parts.append(f"<h3>{html.escape(label)}</h3>" + _admission_table(r))
        parts.append(_img("admission", plots.admission_bars(admitted), "admission: slowdown and episodes per hour"))
    parts.append("</body></html>")
    return "\n".join(parts)


def _admission_table(r: dict[str, Any]) -> str:
    cap, offered = r["capacity"], r["offered"]
    rows: list[Sequence[object]] = [
        ("capacity (commands at once)", f"{cap['slots']} ({cap['source']})", "", ""),
        (
            "offered",
            f"{offered['episodes_in_flight']} episodes in flight",
            f"{offered.get('busy_sandboxes', '-')} busy sandboxes",
            f"{offered['factor']:g}x",
        ),
        *measure_rows(r),
        ("claims shown", "", "yes" if r["claims"]["shown"] else "no", ""),
    ]
    return _table(["measure", "admit all (a)", "capacity-aware (b)", "b vs a"], rows)


def _study_section(study: dict[str, Any]) -> str:
    hosts = ", ".join(
        f"{name}: {cores if cores == 'all' else f'{cores:g} cores'}" for name, cores in study["hosts"].items()
    )
    rows = [[p["host"], p["part"], f"{p['s']:.0f}"] for p in study["parts"]]
    verdict = "within" if study["within_budget"] else "over"
    command = "sandrl bench study" + (" --quick" if study["quick"] else "")
    return (
        f"<h2 id='study'>The study</h2><p><code>{command}</code>: {html.escape(hosts)} "
        f"(host limit {html.escape(str(study['host_limit']))}); took {study['duration_s']:.0f} s, {verdict} the "
        f"{study['budget_s'] // 60}-minute budget.</p>" + _table(["host", "part", "s"], rows)
    )


def write_report(paths: Sequence[Path | str], out: Path | str, study: dict[str, Any] | None = None) -> Path:
    out = Path(out)
    out.write_text(render_html(load_labelled(paths), study))
    return out


# -- compare


def _pct(a: float | None, b: float | None) -> str:
    if a is None or b is None or a == 0:
        return "-"
    return f"{(b - a) / a * 100:+.1f}%"


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or a == 0:
        return "-"
    return f"{b / a:.2f}x"


def _mean(r: dict[str, Any]) -> EpisodeBreakdown | None:
    eps = r.get("episodes")
    return EpisodeBreakdown.from_dict(eps["mean"]) if eps else None


def _standalone(r: dict[str, Any], cls: str) -> float | None:
    times = [s["median_s"] for s in (r.get("standalone") or {}).values() if s["class"] == cls]
    return math.prod(times) ** (1 / len(times)) if times else None


def compare(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """The study's side-by-side rows: measure, A, B, change (B against A)."""
    rows: list[dict[str, Any]] = []

    def row(measure: str, va: float | None, vb: float | None, change: Callable[[Any, Any], str], spec: str) -> None:
        rows.append({"measure": measure, "a": va, "b": vb, "change": change(va, vb), "format": spec})

    ea, eb = _mean(a), _mean(b)
    for name, attr in (("episode s", "total_s"), ("commands s", "commands_s"), ("verifier s", "verifier_s")):
        row(name, getattr(ea, attr, None), getattr(eb, attr, None), _pct, ".2f")
    cap_a, cap_b = a.get("capacity") or {}, b.get("capacity") or {}
    if cap_a or cap_b:  # episode results have none
        row("capacity (background tasks)", cap_a.get("load"), cap_b.get("load"), _ratio, "d")
        row("capacity per core", cap_a.get("per_core"), cap_b.get("per_core"), _ratio, ".2f")
    for cls in CLASSES:
        pa = ((a.get("full_load") or {}).get("per_core_slowdown") or {}).get(cls)
        pb = ((b.get("full_load") or {}).get("per_core_slowdown") or {}).get(cls)
        if pa is not None or pb is not None:
            row(f"per-core slowdown, {cls}", pa, pb, _pct, ".2f")
    for cls in CLASSES:
        sa, sb = _standalone(a, cls), _standalone(b, cls)
        if sa is not None or sb is not None:
            row(f"standalone s, {cls} (geo mean)", sa, sb, _pct, ".3f")
    kva = ea.kv.idle_fraction if ea is not None and ea.kv is not None else None
    kvb = eb.kv.idle_fraction if eb is not None and eb.kv is not None else None
    row("idle KV fraction", kva, kvb, _pct, ".1%")
    if ea is not None and eb is not None:
        for p in projection.host_ratio(ea, eb):
            rows.append(
                {
                    "measure": f"projection k={p['k']:g}: episode s",
                    "a": p["a_s"],
                    "b": p["b_s"],
                    "change": f"{p['ratio']:.2f}x",
                    "format": ".2f",
                }
            )
    else:
        rows.append({"measure": "projection", "a": None, "b": None, "change": "needs episode runs", "format": ""})
    return rows


def compare_table(label_a: str, label_b: str, rows: Sequence[dict[str, Any]]) -> Table:
    label_a, label_b = escape(label_a), escape(label_b)  # labels name files: text, not markup
    table = Table(title=f"{label_a}  vs  {label_b}")
    table.add_column("measure")
    table.add_column(f"A: {label_a}", justify="right")
    table.add_column(f"B: {label_b}", justify="right")
    table.add_column("B vs A", justify="right")
    for r in rows:
        table.add_row(r["measure"], _fmt(r["a"], r["format"]), _fmt(r["b"], r["format"]), r["change"])
    return table


def compare_files(path_a: Path | str, path_b: Path | str) -> tuple[Table, dict[str, Any]]:
    """The table to print and the JSON result of ``sandrl bench compare A.json B.json``."""
    (la, a), (lb, b) = load_labelled([path_a, path_b])
    for label, r in ((la, a), (lb, b)):
        if r["bench"] == "admission":
            raise ConfigError(
                f"{label} is an admission result, which compares its two ways itself (`sandrl bench report` shows "
                "it); compare takes contention and episodes results of two hosts"
            )
    rows = compare(a, b)
    return compare_table(la, lb, rows), {"bench": "compare", "a": la, "b": lb, "rows": rows}
