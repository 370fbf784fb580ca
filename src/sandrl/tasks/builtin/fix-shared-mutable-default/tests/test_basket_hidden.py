import random
import sys

import pytest

sys.path.insert(0, "/workspace")
from basket import Basket, tag_order  # noqa: E402


def test_many_independent_baskets():
    rng = random.Random(3)
    baskets = [Basket() for _ in range(20)]
    expected = [0] * 20
    for _ in range(200):
        i = rng.randrange(20)
        q = rng.randint(1, 4)
        baskets[i].add(f"item{i}", 1.0, q)
        expected[i] += q
    assert [b.count() for b in baskets] == expected


def test_given_list_is_not_modified():
    start = [("cup", 2.0, 1)]
    b = Basket(start)
    b.add("plate", 3.0, 2)
    assert start == [("cup", 2.0, 1)]
    assert b.count() == 3
    assert Basket(start).count() == 1


def test_default_basket_stays_empty():
    Basket().add("x", 1.0)
    Basket().add("y", 1.0)
    assert Basket().count() == 0
    assert Basket().items == []


def test_tag_order_fresh_each_call():
    empty = Basket()
    for _ in range(3):
        assert tag_order(empty) == ["empty"]
    bulk = Basket().add("screw", 0.1, 12)
    assert tag_order(bulk) == ["bulk"]
    assert tag_order(bulk, ["gift"]) == ["gift", "bulk"]
    assert tag_order(bulk) == ["bulk"]


def test_quantity_validation():
    with pytest.raises(ValueError):
        Basket().add("x", 1.0, 0)
