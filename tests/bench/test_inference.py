"""``bench_engine``: one flat result, and batching that pays off."""

from __future__ import annotations

import json

import pytest

from sandrl.bench.inference import bench_engine, render_card
from sandrl.errors import ConfigError


def test_bench_engine_measures_the_batching_speedup() -> None:
    result = bench_engine(concurrency=8, prompt_tokens=16, max_new_tokens=32, repeats=2)
    json.dumps(result)  # the JSON line of `sandrl bench inference`
    assert (result["requests"], result["concurrency"]) == (8, 8)
    assert result["concurrent_tokens_per_s"] == pytest.approx(8 * 32 / result["concurrent_s"], rel=0.01)
    assert result["mean_batch"] > 4
    # Measured about 10x at 16 and 6x at 8 on 2 busy cores; 2x leaves room for a loaded CI machine.
    assert result["speedup"] > 2
    assert result["torch_threads"] == 1, "the tiny model runs its engine thread single-threaded"
    assert "speedup" in render_card(result)


def test_bench_engine_rejects_nonsense() -> None:
    with pytest.raises(ConfigError):
        bench_engine(concurrency=0)
