#!/bin/bash
# Oracle: a strict regex for the grammar, then a precedence key.
set -euo pipefail
cat > /workspace/semver.py <<'PY'
"""Semantic Versioning 2.0.0: parsing and precedence."""

import functools
import re

NUM = r"0|[1-9][0-9]*"
IDENT = r"[0-9A-Za-z-]+"
PATTERN = re.compile(rf"({NUM})\.({NUM})\.({NUM})(?:-({IDENT}(?:\.{IDENT})*))?(?:\+({IDENT}(?:\.{IDENT})*))?")


def parse(text):
    m = PATTERN.fullmatch(text) if isinstance(text, str) else None
    if not m:
        raise ValueError(f"invalid version {text!r}")
    pre = []
    for ident in (m.group(4) or "").split(".") if m.group(4) else []:
        if ident.isdigit():
            if len(ident) > 1 and ident[0] == "0":
                raise ValueError(f"leading zero in {text!r}")
            pre.append(int(ident))
        else:
            pre.append(ident)
    build = tuple(m.group(5).split(".")) if m.group(5) else ()
    return int(m.group(1)), int(m.group(2)), int(m.group(3)), tuple(pre), build


def _cmp(x, y):
    return (x > y) - (x < y)


def _compare_parsed(pa, pb):
    c = _cmp(pa[:3], pb[:3])
    if c:
        return c
    a, b = pa[3], pb[3]
    if not a or not b:
        return _cmp(not a, not b)
    for x, y in zip(a, b):
        if isinstance(x, int) and isinstance(y, int):
            c = _cmp(x, y)
        elif isinstance(x, int):
            c = -1
        elif isinstance(y, int):
            c = 1
        else:
            c = _cmp(x, y)
        if c:
            return c
    return _cmp(len(a), len(b))


def compare(a, b):
    return _compare_parsed(parse(a), parse(b))


def sort_versions(versions):
    parsed = [(parse(v), v) for v in versions]
    parsed.sort(key=functools.cmp_to_key(lambda x, y: _compare_parsed(x[0], y[0])))
    return [v for _, v in parsed]
PY
