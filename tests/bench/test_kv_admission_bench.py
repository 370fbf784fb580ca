"""``python -m sandrl.bench.kv_admission --quick``: the same burst retracts without the gate and not with it."""

from __future__ import annotations

from sandrl.bench.kv_admission import QUICK, run


def test_the_quick_run_shows_retractions_only_without_the_gate() -> None:
    result = run(QUICK)
    without, gated = result["without"], result["with"]
    assert without["kv_retractions"] > 0 and gated["kv_retractions"] == 0
    assert gated["prefill_tokens"] < without["prefill_tokens"]  # no context computed twice
    assert gated["calls_waited"] > 0 and gated["kv_wait_s_max"] > 0 and without["kv_wait_s_max"] == 0
    assert result["config"]["kv_cache_tokens"] == QUICK.kv_cache_tokens
