"""Capacity finding on synthetic slowdown data with a known answer."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandrl.bench import capacity
from sandrl.errors import ConfigError


def test_within_bar_and_passes() -> None:
    slowdowns = [1.0] * 19 + [3.0]
    assert capacity.within_bar(slowdowns, 1.5) == pytest.approx(0.95)
    assert capacity.passes(slowdowns, 1.5, 0.95)
    assert not capacity.passes([*slowdowns, 3.0], 1.5, 0.95)
    assert capacity.within_bar([1.5], 1.5) == 1.0  # the bar itself is within
    assert not capacity.passes([], 1.5, 0.95)
    assert math.isnan(capacity.within_bar([], 1.5))


def test_by_class_pools_all() -> None:
    out = capacity.by_class([("python", 1.0), ("python", 2.0), ("shell", 1.2)], bar=1.5)
    assert set(out) == {"python", "shell", "all"}
    assert out["python"]["n"] == 2 and out["python"]["within_bar"] == 0.5
    assert out["all"]["n"] == 3 and out["all"]["max"] == 2.0
    assert out["shell"]["p50"] == 1.2


def test_default_levels_scale_with_cores_and_include_full_load() -> None:
    assert capacity.default_levels(2, quick=True) == (0, 1, 2, 4)
    assert capacity.default_levels(2) == (0, 1, 2, 3, 4, 6, 8)
    assert capacity.default_levels(1, quick=True) == (0, 1, 2)
    for cores in (1, 2, 3, 8, 64, 1.5):
        levels = capacity.default_levels(cores)
        assert levels[0] == 0 and levels[-1] >= 3 * cores
        assert capacity.full_load_background(cores) in levels


def test_capacity_from_stops_at_first_failure() -> None:
    assert capacity.capacity_from({0: True, 2: True, 4: False, 8: True}) == 2
    assert capacity.capacity_from({0: False, 1: True}) is None
    assert capacity.capacity_from({0: True, 3: True}) == 3


def synthetic_level(load: int, true_capacity: int, rng: random.Random, n: int = 40) -> list[float]:
    """Probe slowdowns of a host whose latency breaks the bar just above ``true_capacity``:
    up to it 1 command in 40 is slow (97.5% within 1.5x), above it 8 in 40 are (80%)."""
    slow = 1 if load <= true_capacity else 8
    values = [rng.uniform(1.6, 4.0) for _ in range(slow)] + [rng.uniform(1.0, 1.45) for _ in range(n - slow)]
    rng.shuffle(values)
    return values


@pytest.mark.parametrize("true_capacity", [0, 1, 5, 6, 7, 13, 31])
async def test_sweep_then_bisection_finds_the_known_capacity(true_capacity: int) -> None:
    rng = random.Random(true_capacity)
    calls: list[tuple[int, str]] = []

    async def evaluate(load: int, source: str) -> bool:
        calls.append((load, source))
        slowdowns = synthetic_level(load, true_capacity, rng)
        return capacity.passes(slowdowns, bar=1.5, quantile=0.95)

    grid = capacity.default_levels(8)  # 0, 4, 7, 8, 12, 16, 24, 32
    cap = await capacity.find_capacity(grid, evaluate)
    assert cap.load == true_capacity
    assert cap.bound == "exact"
    assert cap.bracket == (true_capacity, true_capacity + 1)
    assert [load for load, source in calls if source == "sweep"] == list(grid)
    bisected = [load for load, source in calls if source == "bisect"]
    assert len(bisected) == len(set(bisected))
    assert all(load not in grid for load in bisected)
    assert [e["load"] for e in cap.evaluated] == [load for load, _ in calls]


async def test_no_failure_is_a_lower_bound_and_idle_failure_is_none() -> None:
    async def always(load: int, source: str) -> bool:
        return True

    async def never(load: int, source: str) -> bool:
        return False

    up = await capacity.find_capacity([0, 2, 4], always)
    assert (up.load, up.bound, up.bracket) == (4, "lower", (4, None))
    down = await capacity.find_capacity([0, 2, 4], never)
    assert (down.load, down.bound) == (None, "none")
    with pytest.raises(ConfigError):
        await capacity.find_capacity([], always)


async def test_without_bisection_the_bracket_stays_open() -> None:
    async def evaluate(load: int, source: str) -> bool:
        return load <= 5

    cap = await capacity.find_capacity([0, 4, 8], evaluate, bisect=False)
    assert (cap.load, cap.bound, cap.bracket) == (4, "lower", (4, 8))


@given(
    threshold=st.integers(min_value=0, max_value=200),
    grid=st.lists(st.integers(min_value=0, max_value=250), min_size=1, max_size=8, unique=True),
)
async def test_bisection_is_exact_for_any_monotone_host(threshold: int, grid: list[int]) -> None:
    measured: list[int] = []

    async def evaluate(load: int, source: str) -> bool:
        measured.append(load)
        return load <= threshold

    cap = await capacity.find_capacity(grid, evaluate)
    assert len(measured) == len(set(measured))
    if min(grid) > threshold:
        assert cap.load is None
    elif max(grid) <= threshold:
        assert cap.load == max(grid) and cap.bound == "lower"
    else:
        assert cap.load == threshold and cap.bound == "exact"
        assert len(measured) <= len(grid) + math.ceil(math.log2(max(grid) + 1))


@pytest.mark.parametrize(
    ("k", "n", "lower", "upper"),
    [(24, 24, 0.025 ** (1 / 24), 1.0), (0, 10, 0.0, 1 - 0.025 ** (1 / 10)), (5, 10, 0.1871, 0.8129)],
)
def test_binomial_interval_is_the_exact_one(k: int, n: int, lower: float, upper: float) -> None:
    lo, hi = capacity.binomial_interval(k, n)
    assert lo == pytest.approx(lower, abs=2e-4) and hi == pytest.approx(upper, abs=2e-4)
    assert capacity.binomial_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ConfigError):
        capacity.binomial_interval(3, 2)


def test_share_section_passes_on_the_point_estimate_and_says_how_sure() -> None:
    one_outlier = capacity.share_section([1.0] * 23 + [2.0], bar=1.5, quantile=0.95)
    assert one_outlier["within"] == 23 and one_outlier["passed"] and not one_outlier["clear"]
    lo, hi = one_outlier["interval"]
    assert lo < 0.95 < hi
    half = capacity.share_section([1.0] * 12 + [2.0] * 12, bar=1.5, quantile=0.95)
    assert not half["passed"] and half["clear"]  # the whole interval is below 95%


def test_capacity_interval_brackets_a_marginal_level() -> None:
    sure = {0: [1.0] * 24, 1: [1.1] * 24, 2: [2.0] * 24}
    out = capacity.capacity_interval(sure, 1.5, 0.95, resamples=500)
    assert (out["low"], out["high"]) == (1, 1) and out["distribution"] == {"1": 1.0}
    marginal = {0: [1.0] * 24, 1: [1.0] * 23 + [2.0], 2: [2.0] * 24}
    out = capacity.capacity_interval(marginal, 1.5, 0.95, resamples=500)
    assert (out["low"], out["high"]) == (0, 1)
    assert 0.5 < out["distribution"]["1"] < 0.95
    assert out == capacity.capacity_interval(marginal, 1.5, 0.95, resamples=500)  # seeded
    idle_fails = {0: [2.0] * 24, 1: [2.0] * 24}
    assert capacity.capacity_interval(idle_fails, 1.5, 0.95, resamples=100)["high"] is None


async def test_the_sweep_can_stop_past_the_first_failure() -> None:
    seen: list[int] = []

    async def evaluate(load: int, source: str) -> bool:
        seen.append(load)
        return load < 2

    cap = await capacity.find_capacity([0, 1, 2, 3, 4, 6, 8], evaluate, past_failure=1)
    assert seen == [0, 1, 2, 3] and cap.load == 1 and cap.bound == "exact"
    seen.clear()
    failing_idle = await capacity.find_capacity([0, 1, 2, 4], lambda n, s: _never(seen, n), past_failure=0, through=1)
    assert seen == [0, 1] and failing_idle.load is None  # the full-load level (1) is measured all the same
    seen.clear()

    async def marginal_at_2(load: int, source: str) -> bool:
        seen.append(load)
        return load < 2

    await capacity.find_capacity([0, 1, 2, 3, 4], marginal_at_2, past_failure=0, clear=lambda n: n >= 3)
    assert seen == [0, 1, 2, 3]  # 2's failure was marginal: the sweep went on to a clear one


async def _never(seen: list[int], load: int) -> bool:
    seen.append(load)
    return False


def test_settle_rejudges_measured_levels() -> None:
    cap = capacity.settle({0: True, 1: True, 2: False, 4: False})
    assert (cap.load, cap.bound, cap.bracket) == (1, "exact", (1, 2))
    assert capacity.settle({0: True, 4: False}).bound == "lower"
    assert capacity.settle({0: False, 1: True}).load is None
