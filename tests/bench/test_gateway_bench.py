"""``sandrl bench gateway`` at a small size: the JSON line's fields, real sessions, no errors."""

from __future__ import annotations

import pytest

from sandrl.bench.gateway import bench_gateway, render_card


def test_the_gateway_benchmark_serves_every_turn_and_measures_its_overhead() -> None:
    result = bench_gateway(sessions=4, turns=2, max_tokens=2)
    assert result["errors"] == 0 and result["turns"] == 8
    assert 0 < result["overhead_ms_p50"] <= result["overhead_ms_p99"]
    assert result["gateway_latency_ms_p50"] > 0 and result["direct_latency_ms_p50"] > 0
    assert isinstance(result["meets_target"], bool)
    assert "gateway overhead per turn" in render_card(result)


@pytest.mark.parametrize(("api", "stream"), [("messages", True), ("responses", True), ("chat", True)])
def test_each_api_streamed_serves_every_turn_and_the_direct_path_replays_its_prompts(api: str, stream: bool) -> None:
    result = bench_gateway(sessions=3, turns=3, max_tokens=2, api=api, stream=stream)
    assert result["errors"] == 0 and result["turns"] == 9 and (result["api"], result["stream"]) == (api, stream)
    assert result["overhead_ms_p50"] > 0 and result["direct_latency_ms_p50"] > 0
    assert f"({api}, streamed)" in render_card(result)


def test_an_unknown_api_is_refused_by_name() -> None:
    from sandrl.errors import ConfigError

    with pytest.raises(ConfigError, match="--api must be one of chat, messages, responses"):
        bench_gateway(sessions=1, turns=1, api="grpc")
