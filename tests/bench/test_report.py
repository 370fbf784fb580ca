"""The JSON result's checks, the HTML page (in headless Chromium), and the two-host comparison."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
import typer
from matplotlib.image import imread
from typer.testing import CliRunner

from sandrl.bench import report
from sandrl.cli import bench as commands
from sandrl.errors import ConfigError
from sandrl.result_file import load_result

from .chromium import dump_dom, needs_chromium, screenshot
from .conftest import synthetic_result

PLOTS = ("slowdown", "capacity", "breakdown", "projection")


def test_load_result_checks_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"bench": "sandbox"}')
    with pytest.raises(ConfigError, match="not a `sandrl bench contention` result"):
        load_result(bad)
    bad.write_text("hello")
    with pytest.raises(ConfigError, match="no JSON object"):
        load_result(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_result(tmp_path / "missing.json")
    # A saved stdout: a table, then the JSON line.
    saved = tmp_path / "stdout.txt"
    saved.write_text("a table\n" + json.dumps(synthetic_result(2, capacity=2, slow=1.0)) + "\n")
    assert load_result(saved)["host"]["cores"] == 2.0


def test_html_has_every_plot_and_the_assumptions(two_results: tuple[Path, Path]) -> None:
    page = report.render_html(report.load_labelled(two_results))
    for name in PLOTS:
        match = re.search(rf'<img id="plot-{name}" class="plot" alt="[^"]*" src="data:image/png;base64,', page)
        assert match, name
    assert "Model time scales as 1/k" in page
    assert "hostA (2 cores)" in page and "hostB (1 cores)" in page


def test_html_without_episodes_says_so(tmp_path: Path) -> None:
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(synthetic_result(2, capacity=2, slow=1.0, episodes=False)))
    page = report.render_html(report.load_labelled([path]))
    assert 'id="plot-slowdown" class="plot"' in page
    assert '<p class="missing" id="plot-breakdown">' in page


@needs_chromium
def test_html_renders_in_chromium(two_results: tuple[Path, Path], tmp_path: Path) -> None:
    out = report.write_report(two_results, tmp_path / "report.html")
    dom = dump_dom(out)
    for name in PLOTS:
        img = re.search(rf'<img id="plot-{name}"[^>]*>', dom)
        assert img, f"plot {name} missing from the rendered page"
        width = re.search(r'data-natural-width="(\d+)"', img.group(0))
        assert width and int(width.group(1)) > 200, f"plot {name} did not decode: {img.group(0)[:200]}"
    shot = imread(io.BytesIO(screenshot(out, tmp_path / "shot.png")), format="png")
    assert shot.shape[0] > 1000 and shot.std() > 0.05  # not a blank page


def test_compare_rows(two_results: tuple[Path, Path]) -> None:
    (_, a), (_, b) = report.load_labelled(two_results)
    rows = {r["measure"]: r for r in report.compare(a, b)}
    ep = rows["episode s"]
    assert ep["change"] == f"{(ep['b'] - ep['a']) / ep['a'] * 100:+.1f}%"
    assert rows["commands s"]["b"] > rows["commands s"]["a"]
    assert rows["capacity (background tasks)"]["change"] == "0.50x"
    assert rows["per-core slowdown, python"]["change"] == "+9.1%"  # 1.2 against 1.1
    assert rows["idle KV fraction"]["b"] > rows["idle KV fraction"]["a"]
    ratios = [float(r["change"][:-1]) for m, r in rows.items() if m.startswith("projection k=")]
    assert len(ratios) == 6 and ratios == sorted(ratios)  # the CPU side weighs more as inference speeds up


def test_compare_without_episodes(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(synthetic_result(2, capacity=3, slow=1.0, episodes=False)))
    b.write_text(json.dumps(synthetic_result(1, capacity=1, slow=2.0, episodes=False)))
    table, result = report.compare_files(a, b)
    rows = {r["measure"]: r for r in result["rows"]}
    assert rows["episode s"]["change"] == "-" and rows["projection"]["change"] == "needs episode runs"
    assert rows["capacity (background tasks)"]["change"] == "0.33x"
    assert table.row_count == len(result["rows"])


def test_commands_are_typer_ready(two_results: tuple[Path, Path], tmp_path: Path) -> None:
    app = typer.Typer()
    app.command("contention")(commands.contention)
    app.command("report")(commands.report)
    app.command("compare")(commands.compare)
    runner = CliRunner()
    out = tmp_path / "r.html"
    res = runner.invoke(app, ["report", *map(str, two_results), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert out.exists() and json.loads(res.stdout.strip().splitlines()[-1])["output"] == str(out)
    res = runner.invoke(app, ["compare", *map(str, two_results), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout.strip().splitlines()[-1])["bench"] == "compare"
    res = runner.invoke(app, ["contention", "--help"])
    assert res.exit_code == 0 and "--cpus-per-host" in res.stdout and "--quantile" in res.stdout
    assert "--idle-only" in res.stdout
    app.command("study")(commands.study)
    res = runner.invoke(app, ["study", "--help"])
    assert res.exit_code == 0 and "--cpus-per-host" in res.stdout and "--out-dir" in res.stdout


def test_parse_levels() -> None:
    assert commands.parse_levels("0, 2,4,8") == (0, 2, 4, 8)
    assert commands.parse_levels(None) is None
    with pytest.raises(ConfigError):
        commands.parse_levels("0,two")


def test_compare_table_prints_its_labels_as_written() -> None:
    from rich.console import Console

    console = Console(file=io.StringIO(), width=200)
    row = {"measure": "p50", "a": 1.0, "b": 2.0, "change": "+100%", "format": ".1f"}
    console.print(report.compare_table("[bold]a.json", "[/runs]/b.json", [row]))
    shown = console.file.getvalue()  # type: ignore[attr-defined]
    assert "[bold]a.json  vs  [/runs]/b.json" in shown and "A: [bold]a.json" in shown
