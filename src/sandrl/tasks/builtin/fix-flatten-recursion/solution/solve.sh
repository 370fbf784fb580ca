#!/bin/bash
# Oracle: treat str/bytes/dict as atoms; depth k removes k levels (recurse while depth > 0).
set -euo pipefail
cat > /workspace/nested.py <<'PY'
"""Flatten nested payloads."""

ATOMS = (str, bytes, bytearray, dict)


def _nestable(value):
    return not isinstance(value, ATOMS) and hasattr(value, "__iter__")


def flatten(value, depth=None):
    if not _nestable(value):
        return [value]
    out = []
    for item in value:
        if _nestable(item) and (depth is None or depth > 0):
            out.extend(flatten(item, None if depth is None else depth - 1))
        else:
            out.append(item)
    return out
PY
