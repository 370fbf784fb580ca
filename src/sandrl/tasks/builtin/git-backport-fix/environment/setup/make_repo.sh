#!/bin/bash
# Builds the task's repository in /workspace: main moved on after the 1.2 release branch.
set -euo pipefail
cd /workspace
git init -q -b main .
git config user.name "Dana Developer"
git config user.email "dana@example.com"
n=0
commit() {
    n=$((n + 1))
    export GIT_AUTHOR_DATE="$((1708000000 + n * 3600)) +0000" GIT_COMMITTER_DATE="$((1708000000 + n * 3600)) +0000"
    git add -A
    git commit -q -m "$1"
}
cat > ranges.py <<'PY'
"""Parse page ranges such as "1-3,7,10-12"."""


def parse_range(spec):
    """The sorted list of page numbers described by spec."""
    pages = set()
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = (int(x) for x in part.split("-", 1))
            if lo > hi:
                raise ValueError(f"bad range {part!r}")
            pages.update(range(lo, hi))
        else:
            pages.add(int(part))
    return sorted(pages)


def format_range(pages):
    """The compact spec for a list of page numbers."""
    pages = sorted(set(pages))
    out = []
    i = 0
    while i < len(pages):
        j = i
        while j + 1 < len(pages) and pages[j + 1] == pages[j] + 1:
            j += 1
        out.append(str(pages[i]) if i == j else f"{pages[i]}-{pages[j]}")
        i = j + 1
    return ",".join(out)
PY
echo "1.2.0" > VERSION
commit "Release 1.2.0"

git branch release-1.2

cat > export.py <<'PY'
"""Export selected pages (new in 1.3)."""

from ranges import parse_range


def export(doc, spec):
    return [doc[p - 1] for p in parse_range(spec)]
PY
commit "Add page export"

sed -i 's/            pages.update(range(lo, hi))/            pages.update(range(lo, hi + 1))/' ranges.py
commit "Fix parse_range dropping the last page of a range"

cat >> ranges.py <<'PY'


def count_pages(spec):
    """How many pages spec selects (new in 1.3)."""
    return len(parse_range(spec))
PY
echo "1.3.0-dev" > VERSION
commit "Add count_pages; start 1.3"

git checkout -q release-1.2
echo "1.2.1-dev" > VERSION
commit "Start 1.2.1"
git checkout -q main
