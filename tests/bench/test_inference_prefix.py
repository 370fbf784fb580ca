"""``sandrl bench inference --prefix-cache`` (quick): the cache halves the prefill work of 4-turn episodes at least,
and every turn generates the same tokens as without it."""

from __future__ import annotations

import json

import pytest

from sandrl.bench.inference_prefix import PrefixBenchConfig, render_card, run
from sandrl.errors import ConfigError


def test_the_prefix_cache_prefills_at_most_half_and_changes_no_generation() -> None:
    result = run(PrefixBenchConfig.quick())
    json.dumps(result)  # the JSON line
    assert result["turns_identical"] == result["turns"] == 16
    assert result["max_logprob_gap"] < 1e-4
    # Measured 0.315 (4 turns, replies of 16 tokens): each turn after the first computes its observation only.
    assert result["prefill_ratio"] <= 0.5 and result["passed"]
    assert result["prefill_tokens_per_episode_off"] == result["prompt_tokens_per_episode"]
    assert result["cached_share"] == pytest.approx(1 - result["prefill_ratio"], abs=1e-3)
    assert "verdict                                  pass" in render_card(result)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="at least 1"):
        PrefixBenchConfig(turns=0)
