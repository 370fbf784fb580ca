#!/bin/bash
set -euo pipefail
cat > /workspace/rle.py <<'PY'
"""Run-length encoding: "aaab" <-> "3a1b"."""

import itertools
import re

_TOKEN = re.compile(r"([1-9][0-9]*)([^0-9])", re.S)


def encode(text: str) -> str:
    if any(ch in "0123456789" for ch in text):
        raise ValueError("input contains digits")
    return "".join(f"{len(list(group))}{ch}" for ch, group in itertools.groupby(text))


def decode(data: str) -> str:
    out = []
    pos = 0
    while pos < len(data):
        m = _TOKEN.match(data, pos)
        if not m:
            raise ValueError(f"malformed input at {pos}: {data[pos:pos + 10]!r}")
        out.append(m.group(2) * int(m.group(1)))
        pos = m.end()
    return "".join(out)
PY
