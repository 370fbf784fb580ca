import random
import re
import sys
from collections import Counter

import pytest

sys.path.insert(0, "/workspace")
from wordfreq import top_words, words  # noqa: E402

VOCAB = ["alpha", "Beta", "GAMMA", "don't", "it's", "'tis", "rock'n'roll", "x1", "42", "o'", "''", "Zeta"]
SEPS = [" ", "  ", ", ", ". ", "!\n", " -- ", "\t", "; ", "?", " (", ") ", "/", "\u00e9"]


def ref_words(text):
    out = []
    for run in re.findall(r"[A-Za-z0-9']+", text):
        run = run.strip("'").lower()
        if run:
            out.append(run)
    return out


def ref_top(text, n):
    counts = Counter(ref_words(text))
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


def random_text(rng):
    return "".join(rng.choice(VOCAB) + rng.choice(SEPS) for _ in range(rng.randint(0, 60)))


def test_words_random():
    rng = random.Random(21)
    for _ in range(500):
        text = random_text(rng)
        assert words(text) == ref_words(text), text


def test_top_words_random():
    rng = random.Random(22)
    for _ in range(500):
        text = random_text(rng)
        n = rng.randint(0, 12)
        assert [tuple(x) for x in top_words(text, n)] == ref_top(text, n), (text, n)


def test_more_than_available():
    assert [tuple(x) for x in top_words("a b a", 10)] == [("a", 2), ("b", 1)]
    assert list(top_words("", 3)) == []
    assert list(top_words("a b", 0)) == []


def test_negative():
    with pytest.raises(ValueError):
        top_words("a b", -3)
