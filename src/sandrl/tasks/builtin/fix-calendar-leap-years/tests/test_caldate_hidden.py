import datetime
import random
import sys

import pytest

sys.path.insert(0, "/workspace")
import caldate  # noqa: E402


def as_tuple(d):
    return (d.year, d.month, d.day)


def test_is_leap_all_years():
    import calendar

    for year in range(1, 3000):
        assert caldate.is_leap(year) == calendar.isleap(year), year


def test_days_in_month_all():
    import calendar

    for year in (1, 4, 100, 400, 1900, 2000, 2023, 2024, 2100, 9999):
        for month in range(1, 13):
            assert caldate.days_in_month(year, month) == calendar.monthrange(year, month)[1]
    for bad in (0, 13, -1):
        with pytest.raises(ValueError):
            caldate.days_in_month(2000, bad)


def test_day_of_year_random():
    rng = random.Random(11)
    for _ in range(2000):
        d = datetime.date.fromordinal(rng.randint(1, 3_000_000))
        assert caldate.day_of_year(as_tuple(d)) == d.timetuple().tm_yday


def test_add_days_random():
    rng = random.Random(12)
    for _ in range(1500):
        d = datetime.date.fromordinal(rng.randint(400_000, 1_000_000))
        n = rng.randint(-2000, 2000)
        assert caldate.add_days(as_tuple(d), n) == as_tuple(d + datetime.timedelta(days=n)), (d, n)


def test_days_between_random():
    rng = random.Random(13)
    for _ in range(2000):
        a = datetime.date.fromordinal(rng.randint(1, 3_000_000))
        b = datetime.date.fromordinal(rng.randint(1, 3_000_000))
        assert caldate.days_between(as_tuple(a), as_tuple(b)) == (b - a).days
