import pytest

from lru import LRUCache


def test_basic():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    assert c.get("a") == 1
    assert c.get("zz", "none") == "none"
    assert (c.hits, c.misses) == (1, 1)


def test_evicts_least_recently_used():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    c.get("a")
    c.put("c", 3)
    assert "b" not in c
    assert c.keys() == ["a", "c"]


def test_update_does_not_evict():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    c.put("a", 10)
    assert len(c) == 2
    assert c.get("a") == 10
    assert c.get("b") == 2


def test_zero_capacity_rejected():
    with pytest.raises(ValueError):
        LRUCache(0)
