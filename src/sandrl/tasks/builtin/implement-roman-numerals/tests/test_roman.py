import sys

import pytest

sys.path.insert(0, "/workspace")
from roman import from_roman, to_roman  # noqa: E402

SYMBOLS = [
    (1000, "M"),
    (900, "CM"),
    (500, "D"),
    (400, "CD"),
    (100, "C"),
    (90, "XC"),
    (50, "L"),
    (40, "XL"),
    (10, "X"),
    (9, "IX"),
    (5, "V"),
    (4, "IV"),
    (1, "I"),
]


def ref(n):
    out = ""
    for value, sym in SYMBOLS:
        while n >= value:
            out += sym
            n -= value
    return out


def test_examples():
    assert to_roman(4) == "IV"
    assert to_roman(1994) == "MCMXCIV"
    assert to_roman(3999) == "MMMCMXCIX"
    assert from_roman("XLII") == 42


def test_all_numbers_round_trip():
    for n in range(1, 4000):
        assert to_roman(n) == ref(n)
        assert from_roman(ref(n)) == n


@pytest.mark.parametrize("bad", [0, -1, 4000, 10**6, 2.5, "5", None, True])
def test_to_roman_rejects(bad):
    with pytest.raises(ValueError):
        to_roman(bad)


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "IIII",
        "IC",
        "VX",
        "MMMM",
        "iv",
        " X",
        "X ",
        "IIX",
        "XM",
        "VV",
        "LL",
        "DD",
        "CMC",
        "XCX",
        "IVI",
        "ABC",
        "MCMC",
        "IIV",
        "XXXX",
        "CCCC",
        "IXI",
        "DM",
        "LC",
    ],
)
def test_from_roman_rejects(bad):
    with pytest.raises(ValueError):
        from_roman(bad)


def test_only_canonical_strings_parse():
    canonical = {ref(n) for n in range(1, 4000)}
    letters = "IVXLCDM"
    import itertools

    for length in (1, 2, 3):
        for chars in itertools.product(letters, repeat=length):
            s = "".join(chars)
            if s in canonical:
                assert to_roman(from_roman(s)) == s
            else:
                with pytest.raises(ValueError):
                    from_roman(s)
