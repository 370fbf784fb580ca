"""Word frequencies."""

import re
from collections import Counter

WORD = re.compile(r"[A-Za-z0-9]+")


def words(text):
    return [w for w in WORD.findall(text)]


def top_words(text, n):
    counts = Counter(words(text))
    return counts.most_common(n)
