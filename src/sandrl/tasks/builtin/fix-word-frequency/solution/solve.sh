#!/bin/bash
# Oracle: apostrophes in the pattern, strip and lowercase, deterministic tie order, validate n.
set -euo pipefail
cat > /workspace/wordfreq.py <<'PY'
"""Word frequencies."""

import re
from collections import Counter

WORD = re.compile(r"[A-Za-z0-9']+")


def words(text):
    out = []
    for run in WORD.findall(text):
        word = run.strip("'").lower()
        if word:
            out.append(word)
    return out


def top_words(text, n):
    if n < 0:
        raise ValueError("n must be >= 0")
    counts = Counter(words(text))
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
PY
