#!/bin/bash
set -euo pipefail
cat > /workspace/jpath.py <<'PY'
"""Dotted/bracketed paths into JSON documents."""

import re

_STEP = re.compile(r"\[(-?[0-9]+)\]|\.?([A-Za-z_][A-Za-z0-9_]*)")
_MISSING = object()


def _parse(path):
    steps = []
    pos = 0
    while pos < len(path):
        m = _STEP.match(path, pos)
        if not m:
            raise ValueError(f"malformed path {path!r} at {pos}")
        if m.group(2) is not None:
            dotted = path[pos] == "."
            if dotted != (pos > 0):
                raise ValueError(f"malformed path {path!r} at {pos}")
            steps.append(m.group(2))
        else:
            steps.append(int(m.group(1)))
        pos = m.end()
    return steps


def _step(node, step):
    if isinstance(step, int):
        if isinstance(node, list) and -len(node) <= step < len(node):
            return node[step]
        return _MISSING
    if isinstance(node, dict) and step in node:
        return node[step]
    return _MISSING


def get_path(doc, path, default=None):
    node = doc
    for step in _parse(path):
        node = _step(node, step)
        if node is _MISSING:
            return default
    return node


def leaf_paths(doc):
    out = {}

    def walk(node, prefix):
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(value, f"{prefix}.{key}" if prefix else key)
        elif isinstance(node, list) and node:
            for i, value in enumerate(node):
                walk(value, f"{prefix}[{i}]")
        else:
            out[prefix] = node

    walk(doc, "")
    return out


def set_path(doc, path, value):
    steps = _parse(path)
    if not steps:
        raise ValueError("cannot set the empty path")
    node = doc
    for i, step in enumerate(steps):
        last = i == len(steps) - 1
        if isinstance(step, int):
            if not isinstance(node, list) or not -len(node) <= step < len(node):
                raise IndexError(f"no element {step} at {path!r}")
            if last:
                node[step] = value
            else:
                node = node[step]
        else:
            if not isinstance(node, dict):
                raise TypeError(f"key {step!r} into a {type(node).__name__} at {path!r}")
            if last:
                node[step] = value
            else:
                node = node.setdefault(step, {})
PY
