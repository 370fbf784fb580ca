import random
import sys

import pytest

sys.path.insert(0, "/workspace")
from lru import LRUCache  # noqa: E402


class Reference:
    def __init__(self, capacity):
        self.capacity = capacity
        self.order = []  # least recent first
        self.data = {}
        self.hits = self.misses = 0

    def get(self, key, default=None):
        if key in self.data:
            self.hits += 1
            self.order.remove(key)
            self.order.append(key)
            return self.data[key]
        self.misses += 1
        return default

    def put(self, key, value):
        if key in self.data:
            self.order.remove(key)
        elif len(self.data) >= self.capacity:
            del self.data[self.order.pop(0)]
        self.order.append(key)
        self.data[key] = value


@pytest.mark.parametrize("seed", range(8))
def test_against_reference(seed):
    rng = random.Random(seed)
    capacity = rng.randint(1, 6)
    cache, ref = LRUCache(capacity), Reference(capacity)
    for step in range(400):
        key = rng.randint(0, 9)
        if rng.random() < 0.5:
            assert cache.get(key, -1) == ref.get(key, -1), step
        else:
            cache.put(key, step)
            ref.put(key, step)
        assert cache.keys() == ref.order
        assert len(cache) == len(ref.data)
        probe = rng.randint(0, 9)
        assert (probe in cache) == (probe in ref.data)
    assert (cache.hits, cache.misses) == (ref.hits, ref.misses)
    assert cache.keys() == ref.order


def test_contains_does_not_touch_recency():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    assert "a" in c
    c.put("c", 3)
    assert c.keys() == ["b", "c"]


@pytest.mark.parametrize("bad", [0, -1])
def test_bad_capacity(bad):
    with pytest.raises(ValueError):
        LRUCache(bad)


def test_capacity_one():
    c = LRUCache(1)
    c.put(1, "x")
    c.put(1, "y")
    assert c.keys() == [1] and c.get(1) == "y"
    c.put(2, "z")
    assert c.keys() == [2] and c.get(1) is None
