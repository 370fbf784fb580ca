#!/bin/bash
set -euo pipefail
cat > /workspace/wrap.py <<'PY'
"""Greedy word wrapping and full justification."""


def wrap(text, width):
    if width < 1:
        raise ValueError("width must be at least 1")
    pieces = []
    for word in text.split():
        pieces.extend(word[i : i + width] for i in range(0, len(word), width))
    lines = []
    current = ""
    for piece in pieces:
        if current and len(current) + 1 + len(piece) <= width:
            current += " " + piece
        else:
            if current:
                lines.append(current)
            current = piece
    if current:
        lines.append(current)
    return lines


def justify(text, width):
    lines = wrap(text, width)
    out = []
    for i, line in enumerate(lines):
        words = line.split(" ")
        if i == len(lines) - 1 or len(words) < 2:
            out.append(line)
            continue
        gaps = len(words) - 1
        q, r = divmod(width - sum(map(len, words)), gaps)
        parts = []
        for j, word in enumerate(words[:-1]):
            parts.append(word + " " * (q + (j < r)))
        out.append("".join(parts) + words[-1])
    return out
PY
