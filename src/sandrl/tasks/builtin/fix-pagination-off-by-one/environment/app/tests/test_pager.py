import pytest

from pager import page_count, page_window, paginate


def test_page_count_exact():
    assert page_count(20, 10) == 2


def test_page_count_partial_page():
    assert page_count(21, 10) == 3


def test_page_count_empty():
    assert page_count(0, 10) == 0


def test_first_page():
    assert paginate(list(range(25)), 1) == list(range(10))


def test_last_partial_page():
    assert paginate(list(range(25)), 3) == [20, 21, 22, 23, 24]


def test_past_the_end():
    assert paginate(list(range(25)), 4) == []


def test_invalid_page():
    with pytest.raises(ValueError):
        paginate([1, 2, 3], 0)


def test_window_middle():
    assert page_window(10, 20) == [8, 9, 10, 11, 12]


def test_window_end():
    assert page_window(20, 20) == [16, 17, 18, 19, 20]


def test_window_small():
    assert page_window(1, 3) == [1, 2, 3]
