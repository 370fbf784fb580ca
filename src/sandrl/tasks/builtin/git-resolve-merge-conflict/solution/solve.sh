#!/bin/bash
# Oracle: write the resolved files, then commit the merge.
set -euo pipefail
cd /workspace
cat > textstats.py <<'PY'
"""Text statistics."""

import re

WORD = re.compile(r"[a-z0-9']+")


def words(text):
    """Lower-cased words: letters, digits and apostrophes."""
    return WORD.findall(text.lower())


def word_count(text):
    """Mapping of each word to its number of occurrences."""
    counts = {}
    for w in words(text):
        counts[w] = counts.get(w, 0) + 1
    return counts


def top_words(text, n):
    """The n most frequent words as (word, count), most frequent first, ties alphabetical."""
    counts = word_count(text)
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
PY
cat > cli.py <<'PY'
"""Command line: python3 cli.py [--top N] FILE"""

import sys

from textstats import top_words, word_count


def usage():
    print("usage: cli.py [--top N] FILE", file=sys.stderr)
    return 2


def main(argv):
    args = argv[1:]
    top = None
    if args[:1] == ["--top"]:
        if len(args) < 2 or not args[1].isdigit():
            return usage()
        top = int(args[1])
        args = args[2:]
    if len(args) != 1:
        return usage()
    with open(args[0]) as f:
        text = f.read()
    if top is not None:
        for word, n in top_words(text, top):
            print(f"{word} {n}")
        return 0
    counts = word_count(text)
    for word in sorted(counts):
        print(f"{word} {counts[word]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
PY
git add textstats.py cli.py
git commit -q --no-edit
