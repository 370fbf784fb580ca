import copy
import random
import sys

import pytest

sys.path.insert(0, "/workspace")
from intervals import covered, gaps, merge  # noqa: E402


def points(intervals):
    s = set()
    for a, b in intervals:
        s.update(range(a, b + 1))
    return s


def runs(sorted_points):
    out = []
    for p in sorted(sorted_points):
        if out and out[-1][1] + 1 == p:
            out[-1] = (out[-1][0], p)
        else:
            out.append((p, p))
    return out


def test_example():
    data = [(5, 8), (1, 3), (2, 4), (10, 10)]
    assert [tuple(x) for x in merge(data)] == [(1, 8), (10, 10)]
    assert covered(data) == 9
    assert [tuple(x) for x in gaps(data, 0, 12)] == [(0, 0), (9, 9), (11, 12)]


def test_random_against_points():
    rng = random.Random(4)
    for _ in range(1500):
        data = []
        for _ in range(rng.randint(0, 10)):
            a = rng.randint(-30, 30)
            data.append([a, a + rng.randint(0, 8)] if rng.random() < 0.5 else (a, a + rng.randint(0, 8)))
        before = copy.deepcopy(data)
        pts = points(data)
        result = merge(data)
        assert data == before
        assert all(isinstance(x, tuple) for x in result)
        assert result == runs(pts)
        assert covered(data) == len(pts)
        lo, hi = sorted((rng.randint(-40, 40), rng.randint(-40, 40)))
        assert [tuple(x) for x in gaps(data, lo, hi)] == runs(set(range(lo, hi + 1)) - pts)


def test_empty():
    assert merge([]) == []
    assert covered([]) == 0
    assert [tuple(x) for x in gaps([], 3, 5)] == [(3, 5)]


def test_invalid():
    with pytest.raises(ValueError):
        merge([(3, 1)])
    with pytest.raises(ValueError):
        gaps([(1, 2)], 5, 4)


def test_large_values_fast():
    data = [(i * 10**9, i * 10**9 + 10**8) for i in range(20000)]
    assert covered(data) == 20000 * (10**8 + 1)
    assert len(merge(data)) == 20000
