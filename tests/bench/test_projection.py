"""The faster-inference projection's arithmetic."""

from __future__ import annotations

import pytest

from sandrl.bench.breakdown import EpisodeBreakdown, KvUsage
from sandrl.bench.projection import ASSUMPTIONS, SPEEDUPS, episode_time, host_ratio, project, projection_section
from sandrl.errors import ConfigError

# 60 s model, 30 s commands, 8 s verifier, 0.5 s create, 1.5 s other = 100 s.
FAST_CPU = EpisodeBreakdown(100.0, 60.0, 30.0, 8.0, 0.5, KvUsage(600.0, 300.0))
# The same episode on a host whose commands and verifier take twice as long.
SLOW_CPU = EpisodeBreakdown(138.0, 60.0, 60.0, 16.0, 0.5, KvUsage(600.0, 600.0))


def test_episode_time_scales_only_the_model() -> None:
    assert episode_time(FAST_CPU, 1) == 100.0
    assert episode_time(FAST_CPU, 2) == 70.0
    assert episode_time(FAST_CPU, 32) == pytest.approx(60 / 32 + 40)
    with pytest.raises(ConfigError):
        episode_time(FAST_CPU, 0)


def test_project_rows() -> None:
    rows = project(FAST_CPU)
    assert [r["k"] for r in rows] == list(SPEEDUPS) == [1, 2, 4, 8, 16, 32]
    assert rows[0]["model_fraction"] == 0.6 and rows[0]["sandbox_fraction"] == 0.4
    assert rows[2]["episode_s"] == 55.0  # 15 + 40
    assert all(r["model_fraction"] + r["sandbox_fraction"] == pytest.approx(1.0) for r in rows)
    # KV: 600 decoding / k against 300 idle.
    assert rows[0]["kv_idle_fraction"] == pytest.approx(1 / 3, abs=1e-4)
    assert rows[1]["kv_idle_fraction"] == pytest.approx(0.5)
    assert [r["episode_s"] for r in rows] == sorted((r["episode_s"] for r in rows), reverse=True)


def test_host_ratio_grows_towards_the_cpu_ratio() -> None:
    rows = host_ratio(FAST_CPU, SLOW_CPU)
    assert rows[0]["ratio"] == 1.38
    assert rows[1]["ratio"] == pytest.approx(108 / 70, abs=1e-4)
    ratios = [r["ratio"] for r in rows]
    assert ratios == sorted(ratios)
    # As k grows the model vanishes: the ratio tends to (138 - 60) / (100 - 60) = 1.95.
    assert ratios[-1] < 1.95 and ratios[-1] > 1.9


def test_projection_section_states_its_assumptions() -> None:
    section = projection_section(FAST_CPU)
    assert section["assumptions"] == list(ASSUMPTIONS) and len(ASSUMPTIONS) >= 3
    assert len(section["points"]) == 6
