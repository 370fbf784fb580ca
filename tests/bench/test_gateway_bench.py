"""``sandrl bench gateway`` at a small size: the JSON line's fields, real sessions, no errors."""

from __future__ import annotations

from sandrl.bench.gateway import bench_gateway, render_card


def test_the_gateway_benchmark_serves_every_turn_and_measures_its_overhead() -> None:
    result = bench_gateway(sessions=4, turns=2, max_tokens=2)
    assert result["errors"] == 0 and result["turns"] == 8
    assert 0 < result["overhead_ms_p50"] <= result["overhead_ms_p99"]
    assert result["gateway_latency_ms_p50"] > 0 and result["direct_latency_ms_p50"] > 0
    assert isinstance(result["meets_target"], bool)
    assert "gateway overhead per turn" in render_card(result)
