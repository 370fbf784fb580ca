import copy
import random
import sys

import pytest

sys.path.insert(0, "/workspace")
from jpath import get_path, leaf_paths, set_path  # noqa: E402

DOC = {"a": {"b": [10, {"c": 3}]}}


def test_examples():
    assert get_path(DOC, "a.b[1].c") == 3
    assert get_path(DOC, "a.x", 0) == 0
    assert leaf_paths(DOC) == {"a.b[0]": 10, "a.b[1].c": 3}
    assert get_path(DOC, "") is DOC


def test_get_variants():
    doc = {"users": [{"name": "ann", "tags": ["x", "y"]}, {"name": "bob", "tags": []}], "n": 0, "z": None}
    assert get_path(doc, "users[-1].name") == "bob"
    assert get_path(doc, "users[0].tags[1]") == "y"
    assert get_path(doc, "users[5].name", "no") == "no"
    assert get_path(doc, "users.name", "no") == "no"
    assert get_path(doc, "n[0]", "no") == "no"
    assert get_path(doc, "n.x", "no") == "no"
    assert get_path(doc, "z", "no") is None
    assert get_path([[1, 2], [3]], "[1][0]") == 3
    assert get_path({"k_1": {"_x": 5}}, "k_1._x") == 5


@pytest.mark.parametrize("bad", ["a..b", "a[", "a[x]", ".a", "a.", "1a", "a[1", "a]", "a.[0]", "a b", "[0]x"])
def test_malformed(bad):
    with pytest.raises(ValueError):
        get_path(DOC, bad)


def random_doc(rng, level=0):
    r = rng.random()
    if level > 3 or r < 0.25:
        return rng.choice([1, "s", None, True, 2.5, [], {}])
    if r < 0.6:
        return [random_doc(rng, level + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(["a", "b", "c_1", "_d", "Key9"]): random_doc(rng, level + 1) for _ in range(rng.randint(0, 4))}


def ref_leaves(doc, prefix=""):
    out = {}
    if isinstance(doc, dict) and doc:
        for k, v in doc.items():
            out.update(ref_leaves(v, f"{prefix}.{k}" if prefix else k))
    elif isinstance(doc, list) and doc:
        for i, v in enumerate(doc):
            out.update(ref_leaves(v, f"{prefix}[{i}]"))
    else:
        out[prefix] = doc
    return out


def test_leaf_paths_random():
    rng = random.Random(31)
    for _ in range(800):
        doc = {"root": random_doc(rng)}
        leaves = leaf_paths(doc)
        expected = ref_leaves(doc)
        assert leaves == expected
        assert list(leaves) == list(expected)
        for path, value in leaves.items():
            assert get_path(doc, path) == value


def test_set_path():
    doc = {"a": [1, {"b": 2}]}
    set_path(doc, "a[1].b", 5)
    set_path(doc, "a[-2]", 0)
    set_path(doc, "x.y.z", "new")
    assert doc == {"a": [0, {"b": 5}], "x": {"y": {"z": "new"}}}
    with pytest.raises(IndexError):
        set_path(doc, "a[7]", 1)
    with pytest.raises(TypeError):
        set_path(doc, "a.k", 1)
    with pytest.raises(ValueError):
        set_path(doc, "", 1)


def test_set_then_get_random():
    rng = random.Random(32)
    for _ in range(300):
        doc = {"root": random_doc(rng)}
        for path in list(leaf_paths(doc)):
            before = copy.deepcopy(doc)
            set_path(doc, path, "MARK")
            assert get_path(doc, path) == "MARK"
            set_path(doc, path, get_path(before, path))
            assert doc == before
