"""``sandrl bench inference --fleet --quick``: one run of 2 launched embedded engines measures the four targets of
#40, and its JSON line says each (the numbers of a quick run on the demo's small model are not the targets')."""

from __future__ import annotations

import io
import json

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from sandrl.bench.fleet import FleetBenchConfig, render_card
from sandrl.cli import bench_inference as commands
from sandrl.errors import ConfigError
from sandrl.inference.weight_push import DEFAULT_BUCKET_BYTES
from sandrl.inference.weight_shm import shm_room

pytestmark = pytest.mark.timeout(180)


def test_the_quick_run_measures_every_target_on_one_fleet() -> None:
    app = typer.Typer()
    app.command("inference")(commands.bench_inference)
    app.command("other")(commands.bench_gateway)  # two commands: typer keeps the name "inference"
    res = CliRunner().invoke(app, ["inference", "--fleet", "--quick", "--json"])
    assert res.exit_code == 0, res.output
    result = json.loads(res.stdout.strip().splitlines()[-1])
    assert result["bench"] == "inference_fleet" and result["quick"] is True
    reuse = result["reuse"]
    on, off = reuse["affinity"], reuse["round_robin"]
    assert on["prompt_tokens"] == off["prompt_tokens"] > 0  # the same episodes (greedy) both ways
    assert on["turns"] == 4 and on["episodes"] == 4
    assert sum(on["calls_per_engine"]) == sum(off["calls_per_engine"]) == 16
    assert min(on["calls_per_engine"]) > 0 and min(off["calls_per_engine"]) > 0
    # Each turn after the first reuses all of its episode's previous call on the engine that served it.
    assert on["cached_share"] >= on["history_share"] - 0.01
    assert off["cached_share"] <= on["cached_share"]
    push = result["weight_push"]
    assert push["engines"] == 2 and push["pushes_per_way"] == 2 and push["parameters"] > 0
    # The run's choice for engines on this host (shared memory, where /dev/shm holds a bucket), and gloo beside
    # it as what other hosts get.
    backend = "shm" if shm_room() >= DEFAULT_BUCKET_BYTES else "gloo"
    assert push["broadcast"]["backend"] == backend
    ways = ("disk", "broadcast", "gloo") if backend == "shm" else ("disk", "broadcast")
    assert ("gloo" in push) == (backend == "shm")
    for way in ways:
        assert len(push[way]["first_token_s"]) == 2 and push[way]["first_token_s_p50"] > 0
    if backend == "shm":
        assert push["gloo"]["ratio"] == pytest.approx(
            push["gloo"]["first_token_s_p50"] / push["disk"]["first_token_s_p50"], abs=1e-3
        )
    assert push["broadcast"]["bytes_sent"] == 4 * push["parameters"]  # fp32, tied weights sent once
    assert push["disk"]["bytes_read"] == 2 * push["disk"]["bytes_written"] >= push["broadcast"]["bytes_sent"]
    assert push["ratio"] == pytest.approx(
        push["broadcast"]["first_token_s_p50"] / push["disk"]["first_token_s_p50"], abs=1e-3
    )
    router = result["router"]
    assert router["calls"] == 40 and router["episodes_split"] == 0
    prefix = result["prefix_cache"]
    assert prefix["turns_identical"] == prefix["turns"] == 16
    met = result["targets_met"]
    assert met == {
        "reuse": on["cached_share"] >= 0.8,
        "weight_push": push["ratio"] <= 0.5,
        "router_overhead": router["meets_target"],
        "prefix_cache": prefix["passed"],
    }
    assert result["met"] == all(met.values())
    out = io.StringIO()
    Console(file=out, width=200).print(render_card(result))
    card = out.getvalue()
    assert "quick run" in card and f"broadcast ({backend}) vs disk" in card and "round-robin" in card
    assert ("over gloo" in card) == (backend == "shm")


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="at least 1"):
        FleetBenchConfig(pushes=0)
