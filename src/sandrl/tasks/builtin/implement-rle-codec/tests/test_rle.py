import itertools
import random
import sys

import pytest

sys.path.insert(0, "/workspace")
from rle import decode, encode  # noqa: E402


def ref_encode(text):
    return "".join(f"{len(list(g))}{ch}" for ch, g in itertools.groupby(text))


def test_examples():
    assert encode("aaabccdddd") == "3a1b2c4d"
    assert encode("") == ""
    assert encode("x" * 12) == "12x"
    assert decode("3a1b2c4d") == "aaabccdddd"
    assert decode("") == ""


def test_random_round_trip():
    rng = random.Random(99)
    alphabet = "ab \n.-é✓"
    for _ in range(2000):
        text = "".join(
            rng.choice(alphabet) * rng.choice([1, 1, 2, 3, 9, 10, 11, 150]) for _ in range(rng.randint(0, 12))
        )
        enc = encode(text)
        assert enc == ref_encode(text)
        assert decode(enc) == text


@pytest.mark.parametrize("bad", ["a1", "3", "abc9", "0"])
def test_encode_rejects_digits(bad):
    with pytest.raises(ValueError):
        encode(bad)


@pytest.mark.parametrize("bad", ["3", "a", "3ab", "0a", "03a", "2a3", "12", "1a0b", "-1a"])
def test_decode_rejects(bad):
    with pytest.raises(ValueError):
        decode(bad)


def test_decode_big_counts():
    assert decode("100z2y") == "z" * 100 + "yy"
