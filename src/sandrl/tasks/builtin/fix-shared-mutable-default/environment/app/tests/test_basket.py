from basket import Basket, tag_order


def test_baskets_are_independent():
    a = Basket().add("apple", 0.5, 4)
    b = Basket()
    assert a.count() == 4
    assert b.count() == 0


def test_total():
    assert Basket().add("pen", 1.25, 2).add("pad", 3.0).total() == 5.5


def test_tags_do_not_accumulate():
    big = Basket().add("chair", 120.0)
    assert tag_order(big) == ["free-shipping"]
    assert tag_order(Basket()) == ["empty"]
