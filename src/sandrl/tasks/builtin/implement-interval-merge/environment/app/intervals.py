"""Integer interval arithmetic for the booking calendar."""


def merge(intervals):
    raise NotImplementedError


def covered(intervals):
    raise NotImplementedError


def gaps(intervals, lo, hi):
    raise NotImplementedError
