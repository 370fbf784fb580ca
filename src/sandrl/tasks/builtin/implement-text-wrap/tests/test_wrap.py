import random
import sys

import pytest

sys.path.insert(0, "/workspace")
from wrap import justify, wrap  # noqa: E402


def ref_wrap(text, width):
    words = []
    for w in text.split():
        words.extend(w[i : i + width] for i in range(0, len(w), width))
    lines, cur = [], ""
    for w in words:
        if not cur:
            cur = w
        elif len(cur) + 1 + len(w) <= width:
            cur += " " + w
        else:
            lines.append(cur)
            cur = w
    if cur:
        lines.append(cur)
    return lines


def ref_justify(text, width):
    lines = ref_wrap(text, width)
    out = []
    for i, line in enumerate(lines):
        words = line.split(" ")
        if i == len(lines) - 1 or len(words) < 2:
            out.append(line)
            continue
        gaps = len(words) - 1
        spaces = width - sum(len(w) for w in words)
        q, r = divmod(spaces, gaps)
        s = ""
        for j, w in enumerate(words[:-1]):
            s += w + " " * (q + (1 if j < r else 0))
        out.append(s + words[-1])
    return out


def test_examples():
    assert wrap("The quick brown fox jumps", 10) == ["The quick", "brown fox", "jumps"]
    assert justify("aa b c dd eeeeee", 8) == ["aa  b  c", "dd", "eeeeee"]
    assert wrap("abcdefghij xy", 4) == ["abcd", "efgh", "ij", "xy"]
    assert wrap("   \n\t ", 5) == []


def test_random():
    rng = random.Random(17)
    for _ in range(3000):
        words = ["x" * rng.choice([1, 2, 3, 4, 5, 7, 9, 13]) for _ in range(rng.randint(0, 25))]
        text = "".join(w + rng.choice([" ", "  ", "\n", "\t", " \n "]) for w in words)
        width = rng.randint(1, 16)
        assert wrap(text, width) == ref_wrap(text, width), (text, width)
        assert justify(text, width) == ref_justify(text, width), (text, width)


def test_real_text():
    text = (
        "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
        "foolishness, it was the epoch of belief, it was the epoch of incredulity."
    )
    for width in (5, 12, 20, 33, 80):
        lines = wrap(text, width)
        assert lines == ref_wrap(text, width)
        assert all(len(line) <= width for line in lines)
        assert justify(text, width) == ref_justify(text, width)


@pytest.mark.parametrize("width", [0, -3])
def test_bad_width(width):
    with pytest.raises(ValueError):
        wrap("a b", width)
