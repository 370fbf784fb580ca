"""Proleptic Gregorian dates as (year, month, day) tuples."""

_DAYS = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]


def is_leap(year):
    return year % 4 == 0


def days_in_month(year, month):
    if not 1 <= month <= 12:
        raise ValueError(f"bad month {month}")
    if month == 2 and is_leap(year):
        return 29
    return _DAYS[month - 1]


def day_of_year(date):
    year, month, day = date
    return sum(days_in_month(year, m) for m in range(1, month)) + day


def add_days(date, n):
    year, month, day = date
    day += n
    while day > days_in_month(year, month):
        day -= days_in_month(year, month)
        month += 1
        if month > 12:
            month = 1
            year += 1
    while day < 1:
        month -= 1
        if month < 1:
            month = 12
            year -= 1
        day += days_in_month(year, month)
    return (year, month, day)


def _ordinal(date):
    """Days since 0001-01-01 (which is day 1)."""
    year, _, _ = date
    y = year - 1
    return y * 365 + y // 4 - y // 100 + y // 400 + day_of_year(date) - 1


def days_between(a, b):
    return _ordinal(a) - _ordinal(b)
