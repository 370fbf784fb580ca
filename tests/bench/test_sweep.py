"""A --quick-style sweep end to end on two emulated hosts: JSON, HTML (in Chromium), compare.

Tiny on purpose (two levels, a few probes, two workloads); it checks that the pipeline works
and that the result is well formed, never the timings (the machine may be shared).
"""

from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from sandrl.bench import contention, report
from sandrl.bench.contention import ContentionConfig
from sandrl.bench.workloads import CLASSES
from sandrl.result_file import load_result

from .chromium import dump_dom, needs_chromium
from .conftest import REASON

pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")
TWO_CPUS = len(os.sched_getaffinity(0)) >= 2


def tiny(cores: float | None) -> ContentionConfig:
    """Both CPU states on the whole host, the idle one only on the emulated one (and half the time)."""
    return ContentionConfig(
        awake=cores is None,
        levels=(0, 2),
        probes=4,
        workloads=("cpu_script", "sort_uniq"),
        cores=cores,
        warmup=0,
        repeats=1,
        settle_s=0.0,
    )


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    import asyncio

    out: dict[str, Path] = {}
    root = tmp_path_factory.mktemp("sweep")
    for name, cores in (("full", None), ("one_core", 1.0 if TWO_CPUS else None)):
        console = Console(file=io.StringIO(), width=200)
        result = asyncio.run(contention.run(tiny(cores), state_dir=root / f"state-{name}", console=console))
        assert "capacity:" in console.file.getvalue()  # type: ignore[attr-defined]
        path = root / f"{name}.json"
        path.write_text(json.dumps(result) + "\n")
        out[name] = path
    yield out


def _check(result: dict[str, Any]) -> None:
    assert result["bench"] == "contention" and result["version"] == contention.RESULT_VERSION
    for key in ("cpu_model", "cores", "memory_mib", "kernel", "sandbox_backend"):
        assert result["host"][key]
    assert set(result["standalone"]) == {"cpu_script", "sort_uniq"}
    loads = [lv["background"] for lv in result["levels"]]
    assert loads == sorted(loads) and {0, 2} <= set(loads)
    for lv in result["levels"]:
        assert len(lv["probes"]) == 4
        assert {p["class"] for p in lv["probes"]} == {"python", "shell"}
        for p in lv["probes"]:
            alone = result["standalone"][p["workload"]]["median_s"]
            assert p["slowdown"] == pytest.approx(p["seconds"] / alone, rel=1e-3)
        assert 0.0 <= lv["classes"]["all"]["within_bar"] <= 1.0
        assert lv["passed"] == (lv["classes"]["all"]["within_bar"] >= 0.95) == lv["share"]["passed"]
        lo, hi = lv["share"]["interval"]
        assert lo <= lv["share"]["share"] <= hi and lv["share"]["n"] == 4
        assert lv["host_cpu"]["others_cores"] >= 0.0
    assert sum(lv["background_commands"] for lv in result["levels"] if lv["background"] > 0) > 0
    cap = result["capacity"]
    # The sweep steered by its verdicts then; the capacity is the levels' verdicts against the final baseline.
    final = {lv["background"]: lv["passed"] for lv in result["levels"]}
    assert {e["load"] for e in cap["evaluated"]} == set(final)
    if cap["load"] is not None:
        assert final[cap["load"]]
        assert cap["bound"] == "lower" or not final[cap["bracket"][1]]
    else:
        assert not final[min(final)]
    assert set(cap["per_class"]) == {"python", "shell"}
    assert set(cap["interval"]) >= {"low", "high", "distribution"}
    assert cap["diagnosis"] is None or cap["diagnosis"].startswith("even the idle level failed")
    # The baseline: both CPU states, a pair of passes at the start and before every level.
    base = result["baseline"]
    states = ["idle", "awake"] if result["config"]["awake"] else ["idle"]
    assert base["states"] == states and (base["awake_loops"] is None) == (len(states) == 1)
    assert [p["label"] for p in base["passes"]].count("start") == len(states)
    assert {p["label"] for p in base["passes"]} - {"start"} == {f"before {n}" for n in loads[1:]}
    for name, row in base["workloads"].items():
        medians = [row[f"{s}_median_s"] for s in states]
        assert result["standalone"][name]["median_s"] == pytest.approx(min(medians), abs=1e-5)
    assert isinstance(result["host_noise"]["quiet"], bool) and "steal_share" in result["host_noise"]["run"]
    full = result["full_load"]
    assert (full["per_core_slowdown"] is None) == (full["per_core_slowdown_idle_baseline"] is None)
    assert result["full_load"]["background"] == int(result["host"]["cores"]) - 1
    assert result["episodes"] is None and result["projection"] is None
    assert not result["background_errors"]


def test_results_are_valid(results: dict[str, Path]) -> None:
    full = load_result(results["full"])
    _check(full)
    one = load_result(results["one_core"])
    _check(one)
    if TWO_CPUS:
        assert one["host"]["cores"] == 1.0 and one["host"]["host_limit"]["mode"] == "affinity"
        assert one["host"]["usable_cpus"] == 1
        assert full["host"]["cores"] >= 2


@needs_chromium
def test_report_renders(results: dict[str, Path], tmp_path: Path) -> None:
    page = report.write_report([results["full"], results["one_core"]], tmp_path / "report.html")
    dom = dump_dom(page)
    for name in ("slowdown", "capacity"):
        img = re.search(rf'<img id="plot-{name}"[^>]*>', dom)
        assert img and int(re.search(r'data-natural-width="(\d+)"', img.group(0)).group(1)) > 200  # type: ignore[union-attr]
    assert "full (" in dom and "one_core (" in dom


def test_compare_two_hosts(results: dict[str, Path]) -> None:
    _, data = report.compare_files(results["full"], results["one_core"])
    rows = {r["measure"]: r for r in data["rows"]}
    assert rows["capacity (background tasks)"]["a"] == json.loads(results["full"].read_text())["capacity"]["load"]
    for cls in ("python", "shell"):
        assert f"per-core slowdown, {cls}" in rows and f"standalone s, {cls} (geo mean)" in rows
    assert not any(f"per-core slowdown, {c}" in rows for c in CLASSES if c not in ("python", "shell"))
