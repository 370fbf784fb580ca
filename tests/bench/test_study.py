"""``sandrl bench study`` end to end with the two benchmarks stubbed: files, comparison, report (in Chromium)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from matplotlib.image import imread
from rich.console import Console

from sandrl.bench import report, study
from sandrl.bench.contention import ContentionConfig
from sandrl.bench.episodes import EpisodesConfig
from sandrl.errors import ConfigError
from sandrl.result_file import load_result

from .chromium import dump_dom, needs_chromium, screenshot
from .conftest import synthetic_result


def _stubs(calls: list[tuple[str, float | None]]) -> tuple[Any, Any]:
    async def run_contention(config: ContentionConfig, *, console: Console) -> dict[str, Any]:
        calls.append(("contention", config.cores))
        cores = config.cores or 2.0
        result = synthetic_result(cores, capacity=int(cores) - 1, slow=2.0 / cores, episodes=False)
        result["capacity"]["interval"] = {"low": 0, "high": int(cores) - 1, "coverage": 0.9, "distribution": {}}
        return result

    async def run_episodes(config: EpisodesConfig, *, console: Console) -> dict[str, Any]:
        calls.append(("episodes", config.cores))
        cores = config.cores or 2.0
        full = synthetic_result(cores, capacity=0, slow=2.0 / cores)
        return {"bench": "episodes", "host": full["host"], "config": {}, "background": {"n": 2}, "duration_s": 3.0,
                "episodes": full["episodes"], "projection": full["projection"]}  # fmt: skip

    return run_contention, run_episodes


@pytest.fixture
def study_dir(tmp_path: Path) -> tuple[Path, dict[str, Any], list[tuple[str, float | None]]]:
    import asyncio

    calls: list[tuple[str, float | None]] = []
    run_contention, run_episodes = _stubs(calls)
    config = study.StudyConfig(quick=True, out_dir=tmp_path / "study")
    console = Console(file=io.StringIO(), width=200)
    summary = asyncio.run(
        study.run(config, console=console, usable_cpus=2, run_contention=run_contention, run_episodes=run_episodes)
    )
    return tmp_path / "study", summary, calls


def test_study_runs_both_benchmarks_on_both_hosts(study_dir: tuple[Path, dict[str, Any], list[Any]]) -> None:
    out, summary, calls = study_dir
    assert calls == [("contention", None), ("episodes", None), ("contention", 1.0), ("episodes", 1.0)]
    assert summary["hosts"] == {"hostA": "all", "hostB": 1.0}
    assert summary["within_budget"] and summary["duration_s"] >= 0
    assert [p["part"] for p in summary["parts"]] == ["contention", "episodes"] * 2
    for name in ("hostA.json", "hostB.json", "compare.json", "report.html", "study.json"):
        assert (out / name).exists(), name
    host_b = load_result(out / "hostB.json")  # one file: the sweep, with the episode run in it
    assert host_b["bench"] == "contention" and host_b["episodes"] and host_b["projection"]
    assert host_b["episode_run"]["background"] == {"n": 2}
    rows = {r["measure"]: r for r in json.loads((out / "compare.json").read_text())["rows"]}
    assert rows["capacity (background tasks)"]["a"] == 1 and rows["capacity (background tasks)"]["b"] == 0
    assert "projection k=8: episode s" in rows
    assert json.loads((out / "study.json").read_text())["files"]["report"] == str(out / "report.html")


def test_study_sizes_fit_the_budget() -> None:
    full = study.contention_config(False, None, "auto", 0).resolve(2)
    assert full.past_failure == 1 and full.workloads and len(full.workloads) == 9
    quick = study.contention_config(True, 1.0, "auto", 0).resolve(1)
    assert quick.past_failure == 0 and quick.probes == 24
    assert study.episodes_config(False, None, "auto", 0).resolve(2).episodes == 16
    assert study.second_host_cores(2) == 1.0 and study.second_host_cores(1) == 1.0
    with pytest.raises(ConfigError, match="cpus-per-host"):
        study.StudyConfig(cpus_per_host=3).host_b(2)


def test_report_puts_the_seed_figures_beside_this_run(study_dir: tuple[Path, dict[str, Any], list[Any]]) -> None:
    out, _, _ = study_dir
    page = (out / "report.html").read_text()
    assert "The seed&#x27;s published figures" in page or "The seed's published figures" in page
    rows = report.seed_rows(report.load_labelled([out / "hostA.json", out / "hostB.json"]))
    per_core = next(r for r in rows if r[0] == "per-core slowdown at full load")
    assert per_core[2:4] == ["5-22%", "40-70%"] and "python" in str(per_core[4])
    assert all(r[2] == "not published" for r in rows if r is not per_core)
    ratio = next(r for r in rows if r[0].startswith("host B / host A"))
    assert ratio[4] == "reference" and str(ratio[5]).endswith("x")
    assert "id='study'" in page and "sandrl bench study --quick" in page


@needs_chromium
def test_study_report_screenshot(study_dir: tuple[Path, dict[str, Any], list[Any]], tmp_path: Path) -> None:
    out, _, _ = study_dir
    page = out / "report.html"
    dom = dump_dom(page)
    assert "seed: Vera" in dom and "seed: Turin" in dom and "this run: hostA" in dom
    for name in ("slowdown", "capacity", "breakdown", "projection"):
        img = re.search(rf'<img id="plot-{name}"[^>]*>', dom)
        assert img, name
        width = re.search(r'data-natural-width="(\d+)"', img.group(0))
        assert width and int(width.group(1)) > 200, name
    shot = imread(io.BytesIO(screenshot(page, tmp_path / "study.png")), format="png")
    assert shot.shape[0] > 1000 and shot.std() > 0.05  # rendered, not a blank page


def _v2(result: dict[str, Any], load: int | None) -> dict[str, Any]:
    """A synthetic contention result with version 2's keys (share, host CPU, baseline, noise)."""
    for lv in result["levels"]:
        lv["share"] = {"within": 24, "n": 24, "share": 1.0, "interval": [0.86, 1.0], "passed": True, "clear": False}
        lv["host_cpu"] = {"others_cores": 0.02}
    result["capacity"].update(
        load=load,
        interval={"low": load, "high": load, "coverage": 0.9, "distribution": {}},
        diagnosis=None if load is not None else "even the idle level failed (20 of 24 ...): other work: 1.30 cores",
    )
    result["full_load"].update(per_core_slowdown_idle_baseline={"python": 1.0}, explanation=None)
    result["baseline"] = {"workloads": {"cpu_script": {"awake_over_idle": 1.02}}}
    result["host_noise"] = {"quiet": load is not None, "findings": [] if load is not None else ["other work: 1.30"]}
    return result


def test_card_says_why_there_is_no_capacity() -> None:
    from sandrl.bench.contention import print_card

    for load, expected in ((1, "capacity: 1 background tasks; 90% interval 1-1"), (None, "not measurable")):
        console = Console(file=io.StringIO(), width=300)
        print_card(_v2(synthetic_result(2, capacity=1, slow=1.0), load), console)
        text = console.file.getvalue()  # type: ignore[attr-defined]
        assert expected in text, text
        assert ("other work: 1.30 cores" in text) == (load is None)
