"""``sandrl bench inference --update-policy``: a seconds-long run, its JSON fields, and what each
policy must do by construction (no policy throws tokens away; the abort reference does; only
in_place and abort_and_resume split episodes across versions)."""

from __future__ import annotations

import json
import random

import pytest

from sandrl.bench.inference_updates import UpdateBenchConfig, draw_length, render_card, run
from sandrl.errors import ConfigError

ROW_FIELDS = {
    "episodes",
    "episodes_per_hour",
    "episodes_per_hour_vs_in_place",
    "tokens_per_s",
    "updates",
    "update_latency_p50_s",
    "tokens_discarded",
    "tokens_discarded_per_update",
    "tokens_over_staleness_per_update",
    "mixed_version_episodes",
    "token_staleness_hist",
    "length_p50",
    "length_p99",
    "length_max",
    "decode_steps_per_s",
}


def test_a_tiny_run_reports_every_policy_and_the_reference() -> None:
    result = run(UpdateBenchConfig.quick(duration_s=1.5, update_every_s=0.3, median_tokens=12, max_tokens=64))
    json.loads(json.dumps(result))  # the JSON line
    assert result["bench"] == "inference_updates"
    assert set(result["policies"]) == {"in_place", "pause", "abort_and_resume"}
    rows = {**result["policies"], "abort": result["reference_abort"]}
    for name, row in rows.items():
        assert set(row) >= ROW_FIELDS, name
        assert row["episodes"] > 0 and row["updates"] > 0, name
        assert row["length_max"] <= 64
    for policy in ("in_place", "pause", "abort_and_resume"):
        assert rows[policy]["tokens_discarded"] == 0, policy  # none of the policies loses a token
    assert rows["pause"]["mixed_version_episodes"] == 0  # each episode ran on one version
    assert result["policies"]["in_place"]["episodes_per_hour_vs_in_place"] == 1.0
    assert result["policies"]["in_place"]["vs_in_place_by_round"] == [1.0] * result["config"]["rounds"]
    assert len(result["policies"]["pause"]["vs_in_place_by_round"]) == result["config"]["rounds"]
    assert isinstance(result["target_met"], bool)
    card = render_card(result)
    assert "abort (reference)" in card and "target:" in card


def test_one_policy_alone_and_bad_settings() -> None:
    result = run(UpdateBenchConfig.quick(policies=("abort_and_resume",), reference_abort=False, duration_s=0.6))
    assert set(result["policies"]) == {"abort_and_resume"} and result["reference_abort"] is None
    assert result["target_met"] is None  # no in_place row to compare with
    assert result["policies"]["abort_and_resume"]["vs_in_place_by_round"] == []
    with pytest.raises(ConfigError, match="policies"):
        UpdateBenchConfig(policies=("later",))
    with pytest.raises(ConfigError, match="rounds"):
        UpdateBenchConfig(rounds=0)
    with pytest.raises(ConfigError, match="median_tokens"):
        UpdateBenchConfig(median_tokens=2, min_tokens=4)


def test_lengths_have_a_long_tail_within_their_bounds() -> None:
    config = UpdateBenchConfig()
    rng = random.Random(0)
    lengths = sorted(draw_length(rng, config) for _ in range(2000))
    assert lengths[0] >= config.min_tokens and lengths[-1] <= config.max_tokens
    assert 40 <= lengths[1000] <= 56  # the median
    assert lengths[1980] > 4 * lengths[1000]  # the 99th percentile: a tail
