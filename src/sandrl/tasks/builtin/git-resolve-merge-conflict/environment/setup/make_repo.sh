#!/bin/bash
# Builds the task's repository in /workspace: two diverged branches and a merge left in conflict.
set -euo pipefail
cd /workspace
git init -q -b main .
git config user.name "Dana Developer"
git config user.email "dana@example.com"
n=0
commit() {
    n=$((n + 1))
    export GIT_AUTHOR_DATE="$((1706000000 + n * 3600)) +0000" GIT_COMMITTER_DATE="$((1706000000 + n * 3600)) +0000"
    git add -A
    git commit -q -m "$1"
}

cat > textstats.py <<'PY'
"""Text statistics."""

import re

WORD = re.compile(r"[a-z']+")


def words(text):
    return WORD.findall(text.lower())


def count_words(text):
    counts = {}
    for w in words(text):
        counts[w] = counts.get(w, 0) + 1
    return counts
PY
cat > cli.py <<'PY'
"""Command line: python3 cli.py FILE"""

import sys

from textstats import count_words


def main(argv):
    with open(argv[1]) as f:
        counts = count_words(f.read())
    for word in sorted(counts):
        print(f"{word} {counts[word]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
PY
commit "Word counts"

git checkout -q -b feature/top-words
cat > textstats.py <<'PY'
"""Text statistics."""

import re

WORD = re.compile(r"[a-z']+")


def words(text):
    return WORD.findall(text.lower())


def count_words(text):
    counts = {}
    for w in words(text):
        counts[w] = counts.get(w, 0) + 1
    return counts


def top_words(text, n):
    """The n most frequent words as (word, count), most frequent first, ties alphabetical."""
    counts = count_words(text)
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
PY
commit "Add top_words"
cat > cli.py <<'PY'
"""Command line: python3 cli.py [--top N] FILE"""

import sys

from textstats import count_words, top_words


def main(argv):
    args = argv[1:]
    top = None
    if args[:1] == ["--top"]:
        top = int(args[1])
        args = args[2:]
    with open(args[0]) as f:
        text = f.read()
    if top is not None:
        for word, n in top_words(text, top):
            print(f"{word} {n}")
        return 0
    counts = count_words(text)
    for word in sorted(counts):
        print(f"{word} {counts[word]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
PY
commit "cli: --top N"

git checkout -q main
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
PY
commit "Rename count_words to word_count; count digits as word characters"
cat > cli.py <<'PY'
"""Command line: python3 cli.py FILE"""

import sys

from textstats import word_count


def main(argv):
    if len(argv) != 2:
        print("usage: cli.py FILE", file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        counts = word_count(f.read())
    for word in sorted(counts):
        print(f"{word} {counts[word]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
PY
commit "cli: usage message"

export GIT_AUTHOR_DATE="$((1706000000 + 99 * 3600)) +0000" GIT_COMMITTER_DATE="$((1706000000 + 99 * 3600)) +0000"
git merge --no-edit feature/top-words > /dev/null 2>&1 || true
rm -rf __pycache__
