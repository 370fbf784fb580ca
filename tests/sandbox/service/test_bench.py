"""The service benchmark end to end, at small sizes: one JSON-able dict with every measure."""

from __future__ import annotations

import io
import json

from rich.console import Console

from sandrl.bench.service import run

from ...support import needs_sandbox

pytestmark = needs_sandbox


async def test_bench_service_small_run() -> None:
    out = io.StringIO()
    console = Console(file=out, width=200)
    result = await run(concurrency=[1, 4], n_exec=20, execs=2, console=console, rounds=2, min_cycles=6)
    json.dumps(result)
    assert [row["level"] for row in result["levels"]] == [1, 4]
    # Two bursts of each mode, each of at least 6 cycles: 1 client runs 6 one after another, 4 run 2 each.
    assert [row["cycles_per_client"] for row in result["levels"]] == [6, 2]
    for row in result["levels"]:
        for via in ("http", "inproc"):
            r = row[via]
            cycles = 2 * row["level"] * row["cycles_per_client"]
            assert r["bursts"] == 2 and r["cycles"] == cycles and r["exec"]["n"] == cycles * 2
            assert r["errors"] == 0 and r["cycles_per_s"] > 0
        assert row["http_over_inproc"] == round(row["http"]["cycles_per_s"] / row["inproc"]["cycles_per_s"], 3)
        assert len(row["http_over_inproc_by_round"]) == 2 and all(x > 0 for x in row["http_over_inproc_by_round"])
        # Which side limits: the server's CPU is measured for HTTP (in clock ticks: a small run may
        # read 0); in process there is no server.
        assert row["http"]["cpu_ms_per_cycle"]["server"] >= 0 and row["inproc"]["cpu_ms_per_cycle"]["server"] is None
    rt = result["exec_round_trip"]
    assert rt["http"]["n"] == rt["inproc"]["n"] == 20 and rt["http"]["p50_ms"] > 0
    assert result["transport"] == "channel"
    assert set(result["met"]) == {
        "http_exec_over_inproc_p50_ms",
        "zero_errors_at_max",
        "p99_over_p50_exec_at_max",
        "http_over_inproc_cycles",
    }
    assert "sandbox service vs in-process" in out.getvalue()
