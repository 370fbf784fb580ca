import random
import sys

import pytest

sys.path.insert(0, "/workspace")
from semver import compare, parse, sort_versions  # noqa: E402

CHAIN = [
    "1.0.0-alpha",
    "1.0.0-alpha.1",
    "1.0.0-alpha.beta",
    "1.0.0-beta",
    "1.0.0-beta.2",
    "1.0.0-beta.11",
    "1.0.0-rc.1",
    "1.0.0",
    "2.0.0",
    "2.1.0",
    "2.1.1",
    "10.0.0",
]


def test_parse():
    assert parse("1.2.3") == (1, 2, 3, (), ())
    assert parse("1.0.0-alpha.1+build.5") == (1, 0, 0, ("alpha", 1), ("build", "5"))
    assert parse("0.0.0-0a.x-y+001") == (0, 0, 0, ("0a", "x-y"), ("001",))


@pytest.mark.parametrize(
    "bad",
    [
        "1",
        "1.2",
        "1.2.3.4",
        "01.2.3",
        "1.02.3",
        "1.2.03",
        "1.2.3-01",
        "1.2.3-",
        "1.2.3+",
        "1.2.3-a..b",
        "v1.2.3",
        " 1.2.3",
        "1.2.3 ",
        "1.2.3-a_b",
        "a.b.c",
        "1.2.-3",
        "",
        "1.2.3+a..b",
        "1.2.3-+b",
    ],
)
def test_parse_rejects(bad):
    with pytest.raises(ValueError):
        parse(bad)


def test_chain():
    for i, a in enumerate(CHAIN):
        for j, b in enumerate(CHAIN):
            expected = (i > j) - (i < j)
            assert compare(a, b) == expected, (a, b)


def test_build_metadata_ignored():
    assert compare("1.0.0+a", "1.0.0+b") == 0
    assert compare("1.0.0-rc.1+x", "1.0.0-rc.1") == 0


def test_sort_shuffled():
    rng = random.Random(1)
    for _ in range(50):
        shuffled = CHAIN[:]
        rng.shuffle(shuffled)
        assert sort_versions(shuffled) == CHAIN


def test_sort_stable_and_numeric():
    assert sort_versions(["1.0.0+b", "1.0.0+a", "0.9.10", "0.9.9"]) == ["0.9.9", "0.9.10", "1.0.0+b", "1.0.0+a"]
    assert sort_versions(["1.0.0-2", "1.0.0-10", "1.0.0-a", "1.0.0-1"]) == ["1.0.0-1", "1.0.0-2", "1.0.0-10", "1.0.0-a"]
    assert sort_versions(["1.0.0-B", "1.0.0-a", "1.0.0-A"]) == ["1.0.0-A", "1.0.0-B", "1.0.0-a"]


def test_sort_rejects_invalid():
    with pytest.raises(ValueError):
        sort_versions(["1.0.0", "bad"])
