"""Typer-ready commands of the sandbox-CPU benchmark, for ``cli.py`` to register::

    from sandrl.bench import commands as cpu_bench
    bench_app.command("contention")(cpu_bench.contention)
    bench_app.command("episodes")(cpu_bench.episodes)
    bench_app.command("admission")(cpu_bench.admission)
    bench_app.command("report")(cpu_bench.report)
    bench_app.command("compare")(cpu_bench.compare)

Each prints its table on stderr and ends with one JSON line on stdout.
"""

from __future__ import annotations

import asyncio
import io
import json
import sys
from pathlib import Path
from typing import Literal, cast

import typer
from rich.console import Console

from sandrl.errors import ConfigError

LimitChoice = Literal["auto", "affinity", "quota"]


def _host_limit(value: str) -> LimitChoice:
    """``--host-limit``, checked once for every command that emulates a smaller host."""
    if value not in ("auto", "affinity", "quota"):
        raise ConfigError(f"--host-limit is auto, affinity or quota, not {value!r}")
    return cast(LimitChoice, value)


def parse_levels(text: str | None) -> tuple[int, ...] | None:
    """``"0,1,2,4"`` -> (0, 1, 2, 4); None or empty -> None (the defaults)."""
    if not text:
        return None
    try:
        return tuple(int(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError as exc:
        raise ConfigError(f"--levels takes whole numbers separated by commas (e.g. 0,2,4,8), got {text!r}") from exc


def contention(
    quick: bool = typer.Option(False, "--quick", help="The small run: under 3 minutes on 2 cores."),
    levels: str | None = typer.Option(None, help="Background-task counts, e.g. 0,2,4,8 (default: scaled to cores)."),
    bar: float = typer.Option(1.5, help="Slowdown bar: time / standalone at most this."),
    quantile: float = typer.Option(0.95, help="Fraction of commands that must be within the bar."),
    cpus_per_host: float | None = typer.Option(None, help="Emulate a host of this many cores (default: all)."),
    host_limit: str = typer.Option("auto", help="How to emulate it: auto, affinity (pin) or quota (CFS)."),
    probes: int | None = typer.Option(None, help="Probe commands per level."),
    workloads: str | None = typer.Option(None, help="Workload names, comma-separated (default: all; --quick: 6)."),
    out: Path | None = typer.Option(None, help="Also write the JSON result to this file."),
    json_only: bool = typer.Option(False, "--json", help="Print only the JSON line."),
) -> None:
    """Commands' slowdown as background sandboxes fill the host; capacity at the latency bar."""
    from sandrl.bench.contention import ContentionConfig, run

    config = ContentionConfig(
        quick=quick,
        levels=parse_levels(levels),
        bar=bar,
        quantile=quantile,
        cores=cpus_per_host,
        host_limit=_host_limit(host_limit),
        probes=probes,
        workloads=tuple(w for w in workloads.split(",") if w) if workloads else None,
    )
    console = Console(file=io.StringIO()) if json_only else Console(stderr=True)
    result = asyncio.run(run(config, console=console))
    line = json.dumps(result)
    if out is not None:
        out.write_text(line + "\n")
    print(line)


def _names(text: str | None, what: str) -> tuple[str, ...] | None:
    if text is None:
        return None
    names = tuple(n for n in text.replace(" ", "").split(",") if n)
    if not names:
        raise ConfigError(f"{what} takes names separated by commas")
    return names


def _emit(result: dict[str, object], out: Path | None) -> None:
    line = json.dumps(result)
    if out is not None:
        out.write_text(line + "\n")
    print(line)


def _console(json_only: bool) -> Console:
    """Where the card goes: nowhere with --json; stderr, wide enough for the tables when it is not a terminal."""
    if json_only:
        return Console(file=io.StringIO())
    return Console(stderr=True, width=None if sys.stderr.isatty() else 140)


def episodes(
    quick: bool = typer.Option(False, "--quick", help="The small run: under 3 minutes on 2 cores."),
    n: int | None = typer.Option(None, "--episodes", "-n", help="Episodes in all (default 8 quick, 24 full)."),
    tasks: str | None = typer.Option(None, help="Built-in task ids, comma-separated, or 'all' (default: a mix)."),
    background: int | None = typer.Option(None, help="Background tasks keeping the host busy (default: its cores)."),
    model_s: float | None = typer.Option(None, help="Emulated model seconds per turn (default 1 quick, 2 full)."),
    tokens_per_s: float = typer.Option(50.0, help="Emulated decode speed, for the KV-cache tokens."),
    concurrency: int = typer.Option(2, help="Episodes at once."),
    cpus_per_host: float | None = typer.Option(None, help="Emulate a host of this many cores (default: all)."),
    host_limit: str = typer.Option("auto", help="How to emulate it: auto, affinity (pin) or quota (CFS)."),
    out: Path | None = typer.Option(None, "-o", "--out", help="Also write the JSON result to this file."),
    json_only: bool = typer.Option(False, "--json", help="Print only the JSON line."),
) -> None:
    """Episodes of built-in tasks (replay agent, fixed model time) on a busy host: where their time goes."""
    from sandrl.bench.episodes import EpisodesConfig, run

    config = EpisodesConfig(
        quick=quick,
        episodes=n,
        tasks=_names(tasks, "--tasks"),
        background=background,
        model_s=model_s,
        tokens_per_s=tokens_per_s,
        concurrency=concurrency,
        cores=cpus_per_host,
        host_limit=_host_limit(host_limit),
    )
    _emit(asyncio.run(run(config, console=_console(json_only))), out)


def admission(
    quick: bool = typer.Option(False, "--quick", help="The small run (about 2 minutes on 2 cores)."),
    capacity: str | None = typer.Option(
        None, help="Host capacity: commands at once, or a `bench contention` result file (default: measure it)."
    ),
    factor: float = typer.Option(
        2.0, help="Offered load: factor x capacity busy sandboxes (episodes in flight: that / their busy share)."
    ),
    n: int | None = typer.Option(None, "--episodes", "-n", help="Episodes per way per round."),
    rounds: int | None = typer.Option(None, help="Rounds (each runs both ways, in alternating order)."),
    model_s: float = typer.Option(0.2, help="Emulated model seconds per turn."),
    workloads: str | None = typer.Option(None, help="Workloads each episode runs as its turns, comma-separated."),
    bar: float = typer.Option(1.5, help="Slowdown bar: time / standalone at most this."),
    quantile: float = typer.Option(0.95, help="Fraction of commands that must be within the bar."),
    cpus_per_host: float | None = typer.Option(None, help="Emulate a host of this many cores (default: all)."),
    host_limit: str = typer.Option("auto", help="How to emulate it: auto, affinity (pin) or quota (CFS)."),
    fill_idle_cores: float | None = typer.Option(
        None, help="Capacity-aware also runs a waiting command while this many cores sat idle (default: never)."
    ),
    out: Path | None = typer.Option(None, "-o", "--out", help="Also write the JSON result to this file."),
    json_only: bool = typer.Option(False, "--json", help="Print only the JSON line."),
) -> None:
    """At 2x the host's capacity: admitting every command against capacity-aware admission, side by side."""
    from sandrl.bench.admission import AdmissionConfig, run
    from sandrl.capacity import parse_capacity

    slots, source = parse_capacity(capacity)
    config = AdmissionConfig(
        quick=quick,
        capacity=slots,
        capacity_source=source,
        factor=factor,
        episodes=n,
        rounds=rounds,
        model_s=model_s,
        workloads=_names(workloads, "--workloads"),
        bar=bar,
        quantile=quantile,
        cores=cpus_per_host,
        host_limit=_host_limit(host_limit),
        fill_idle_cores=fill_idle_cores,
    )
    _emit(asyncio.run(run(config, console=_console(json_only))), out)


def report(
    results: list[Path] = typer.Argument(..., help="Result files of `sandrl bench contention` or `episodes`."),
    output: Path = typer.Option(Path("report.html"), "-o", "--output", help="The HTML page to write."),
) -> None:
    """Render result files as one HTML page with the plots."""
    from sandrl.bench.report import write_report

    path = write_report(results, output)
    Console(stderr=True).print(f"wrote {path}")
    print(json.dumps({"bench": "report", "output": str(path), "results": [str(p) for p in results]}))


def compare(
    a: Path = typer.Argument(..., help="Host A's result."),
    b: Path = typer.Argument(..., help="Host B's result."),
    json_only: bool = typer.Option(False, "--json", help="Print only the JSON line."),
) -> None:
    """Two hosts side by side: episode, commands, verifier, capacity, per-core slowdown, idle KV, projection."""
    from sandrl.bench.report import compare_files

    table, result = compare_files(a, b)
    if not json_only:
        _console(False).print(table)
    print(json.dumps(result))
