#!/bin/bash
# Oracle: greedy conversion; parsing accepts exactly the strings to_roman produces.
set -euo pipefail
cat > /workspace/roman.py <<'PY'
"""Roman numerals for the numbers 1..3999."""

SYMBOLS = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
           (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]
_VALUES = {}


def to_roman(n: int) -> str:
    if type(n) is not int or not 1 <= n <= 3999:
        raise ValueError(f"cannot convert {n!r}")
    out = []
    for value, sym in SYMBOLS:
        count, n = divmod(n, value)
        out.append(sym * count)
    return "".join(out)


def from_roman(s: str) -> int:
    if not _VALUES:
        _VALUES.update({to_roman(n): n for n in range(1, 4000)})
    if not isinstance(s, str) or s not in _VALUES:
        raise ValueError(f"not a canonical Roman numeral: {s!r}")
    return _VALUES[s]
PY
