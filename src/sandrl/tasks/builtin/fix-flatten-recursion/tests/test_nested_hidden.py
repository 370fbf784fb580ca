import random
import sys

sys.path.insert(0, "/workspace")
from nested import flatten  # noqa: E402


def random_tree(rng, level=0):
    if level > 4 or rng.random() < 0.3:
        return rng.choice([rng.randint(0, 9), "s" + str(rng.randint(0, 9)), b"b", {"k": 1}, None, 2.5])
    return [random_tree(rng, level + 1) for _ in range(rng.randint(0, 4))]


def reference(value, depth=None):
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
        return [value]
    out = []
    for item in value:
        nestable = not isinstance(item, (str, bytes, dict)) and hasattr(item, "__iter__")
        if nestable and (depth is None or depth > 0):
            out.extend(reference(item, None if depth is None else depth - 1))
        else:
            out.append(item)
    return out


def test_random_trees():
    rng = random.Random(5)
    for _ in range(500):
        tree = [random_tree(rng) for _ in range(rng.randint(0, 5))]
        for depth in (None, 0, 1, 2, 3):
            assert flatten(tree, depth) == reference(tree, depth), (tree, depth)


def test_iterables():
    assert flatten((x for x in [1, [2, 3]])) == [1, 2, 3]
    assert flatten([range(3), (4, 5)]) == [0, 1, 2, 4, 5]
    assert sorted(flatten([{1, 2}])) == [1, 2]


def test_atoms_at_top_level():
    assert flatten(5) == [5]
    assert flatten("hello") == ["hello"]
    assert flatten(b"xy") == [b"xy"]
    assert flatten({"a": [1]}) == [{"a": [1]}]


def test_empty_string_and_new_list():
    assert flatten(["", [""]]) == ["", ""]
    data = [1, 2]
    result = flatten(data)
    assert result == data and result is not data


def test_deep_nesting():
    deep = 1
    for _ in range(200):
        deep = [deep]
    assert flatten(deep) == [1]
    assert flatten(deep, depth=198) == [[1]]
