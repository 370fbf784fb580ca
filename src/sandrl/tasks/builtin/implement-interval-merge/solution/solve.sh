#!/bin/bash
set -euo pipefail
cat > /workspace/intervals.py <<'PY'
"""Integer interval arithmetic for the booking calendar."""


def merge(intervals):
    items = []
    for start, end in intervals:
        if start > end:
            raise ValueError(f"bad interval ({start}, {end})")
        items.append((start, end))
    items.sort()
    out = []
    for start, end in items:
        if out and start <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def covered(intervals):
    return sum(end - start + 1 for start, end in merge(intervals))


def gaps(intervals, lo, hi):
    if lo > hi:
        raise ValueError("lo > hi")
    out = []
    cursor = lo
    for start, end in merge(intervals):
        if end < cursor:
            continue
        if start > hi:
            break
        if start > cursor:
            out.append((cursor, start - 1))
        cursor = end + 1
    if cursor <= hi:
        out.append((cursor, hi))
    return out
PY
