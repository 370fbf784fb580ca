"""The episode breakdown and the KV-idle arithmetic on hand-made traces."""

from __future__ import annotations

import pytest

from sandrl.bench.breakdown import EpisodeBreakdown, KvTurn, KvUsage, episodes_section, kv_turns, kv_usage, mean
from sandrl.errors import ConfigError


def test_kv_one_turn_by_hand() -> None:
    # 1000 tokens of context, 200 out in 2 s: the cache grows 1000 -> 1200, mean 1100 -> 2200 token-s.
    # Then a 3 s command holds all 1200 idle: 3600 token-s.
    usage = kv_usage([KvTurn(context_tokens=1000, output_tokens=200, model_s=2.0, wait_s=3.0)])
    assert usage.decoding_token_s == pytest.approx(2200.0)
    assert usage.idle_token_s == pytest.approx(3600.0)
    assert usage.idle_fraction == pytest.approx(3600 / 5800)


def test_kv_multi_turn_trace() -> None:
    trace = [
        KvTurn(500, 100, 1.0, 4.0),  # decode 550, idle 2400
        KvTurn(900, 100, 1.0, 0.0),  # decode 950, idle 0 (no command: the final answer)
        KvTurn(1200, 0, 0.5, 10.0),  # decode 600, idle 12000
    ]
    usage = kv_usage(trace)
    assert usage.decoding_token_s == pytest.approx(2100.0)
    assert usage.idle_token_s == pytest.approx(14400.0)
    assert usage.idle_fraction == pytest.approx(14400 / 16500)
    faster = usage.with_speedup(4)
    assert faster.decoding_token_s == pytest.approx(525.0) and faster.idle_token_s == usage.idle_token_s
    assert faster.idle_fraction > usage.idle_fraction


def test_kv_edge_cases() -> None:
    assert kv_usage([]).idle_fraction == 0.0
    assert kv_usage([KvTurn(10, 0, 0.0, 5.0)]).idle_fraction == 1.0
    with pytest.raises(ConfigError):
        KvTurn(-1, 0, 0.0, 0.0)


def test_kv_turns_from_rollout_turn_records() -> None:
    records = [
        {"index": 0, "context_tokens": 300, "output_start": 300, "output_end": 350, "model_s": 1.5,
         "sandbox_wait_s": 0.5, "command_s": 0.4},
        {"index": 1, "context_tokens": 420, "output_start": 420, "output_end": 430, "model_s": 0.2},
    ]  # fmt: skip
    turns = kv_turns(records)
    assert turns == [KvTurn(300, 50, 1.5, 0.5), KvTurn(420, 10, 0.2, 0.0)]


def test_breakdown_from_timings_and_other() -> None:
    timings = {
        "queue_s": 9.0,
        "sandbox_create_s": 0.1,
        "setup_s": 0.2,
        "model_s": 5.0,
        "command_s": 2.5,
        "sandbox_wait_s": 3.0,
        "agent_s": 8.1,
        "verifier_s": 1.0,
        "close_s": 0.05,
        "total_s": 9.5,
    }
    b = EpisodeBreakdown.from_timings(timings)
    assert b.commands_s == 3.0  # what the agent waited, transport included
    assert b.other_s == pytest.approx(9.5 - 5.0 - 3.0 - 1.0 - 0.1)
    assert EpisodeBreakdown.from_dict(b.to_dict()) == b
    with pytest.raises(ConfigError):
        EpisodeBreakdown(total_s=1.0, model_s=2.0, commands_s=0.0, verifier_s=0.0, sandbox_create_s=0.0)


def test_mean_weights_kv_by_token_seconds() -> None:
    a = EpisodeBreakdown(10.0, 5.0, 3.0, 1.0, 0.1, KvUsage(100.0, 0.0))
    b = EpisodeBreakdown(20.0, 5.0, 13.0, 1.0, 0.1, KvUsage(100.0, 300.0))
    m = mean([a, b])
    assert m.total_s == 15.0 and m.commands_s == 8.0
    assert m.kv is not None and m.kv.idle_fraction == pytest.approx(300 / 500)  # not (0 + 0.75) / 2
    section = episodes_section([a, b], agent="replay")
    assert section["n"] == 2 and section["agent"] == "replay"
    assert section["mean"]["kv"]["idle_fraction"] == pytest.approx(0.6)
    with pytest.raises(ConfigError):
        mean([])
