import pytest

from caldate import add_days, day_of_year, days_between, days_in_month, is_leap


def test_leap_years():
    assert is_leap(2024)
    assert is_leap(2000)
    assert not is_leap(1900)
    assert not is_leap(2023)


def test_february():
    assert days_in_month(2100, 2) == 28
    assert days_in_month(2400, 2) == 29


def test_bad_month():
    with pytest.raises(ValueError):
        days_in_month(2024, 13)


def test_day_of_year():
    assert day_of_year((2023, 12, 31)) == 365
    assert day_of_year((2024, 3, 1)) == 61


def test_add_days_over_new_year():
    assert add_days((2023, 12, 30), 3) == (2024, 1, 2)
    assert add_days((2024, 1, 2), -3) == (2023, 12, 30)


def test_days_between():
    assert days_between((2024, 1, 1), (2024, 3, 1)) == 60
    assert days_between((2024, 3, 1), (2024, 1, 1)) == -60
