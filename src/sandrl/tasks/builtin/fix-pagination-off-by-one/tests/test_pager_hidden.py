import random
import sys

import pytest

sys.path.insert(0, "/workspace")
from pager import page_count, page_window, paginate  # noqa: E402


def test_page_count_matches_ceil():
    for total in range(0, 60):
        for per_page in range(1, 12):
            assert page_count(total, per_page) == -(-total // per_page)


def test_page_count_rejects_zero():
    with pytest.raises(ValueError):
        page_count(10, 0)


def test_pages_partition_the_items():
    rng = random.Random(7)
    for _ in range(200):
        items = [rng.randint(0, 999) for _ in range(rng.randint(0, 80))]
        per_page = rng.randint(1, 15)
        pages = page_count(len(items), per_page)
        joined = []
        for p in range(1, pages + 1):
            chunk = paginate(items, p, per_page)
            assert 1 <= len(chunk) <= per_page
            joined.extend(chunk)
        assert joined == items
        assert paginate(items, pages + 1, per_page) == []


def test_paginate_rejects_bad_arguments():
    for page, per_page in ((0, 10), (-1, 10), (1, 0)):
        with pytest.raises(ValueError):
            paginate([1, 2, 3], page, per_page)


def test_window_properties():
    for pages in range(0, 30):
        for page in range(1, max(pages, 1) + 1):
            for width in (1, 2, 3, 5, 8):
                win = page_window(page, pages, width)
                if pages == 0:
                    assert win == []
                    continue
                assert len(win) == min(width, pages)
                assert win == list(range(win[0], win[0] + len(win)))
                assert win[0] >= 1 and win[-1] <= pages
                assert page in win
                # as centred as possible: shifting the window cannot make it more balanced
                left, right = page - win[0], win[-1] - page
                if win[0] > 1 and win[-1] < pages:
                    assert abs(left - right) <= 1


def test_window_examples():
    assert page_window(10, 20) == [8, 9, 10, 11, 12]
    assert page_window(1, 20) == [1, 2, 3, 4, 5]
    assert page_window(20, 20) == [16, 17, 18, 19, 20]
    assert page_window(2, 3) == [1, 2, 3]
    assert page_window(3, 3, width=5) == [1, 2, 3]
