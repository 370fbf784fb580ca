from nested import flatten


def test_numbers():
    assert flatten([1, [2, [3, [4]]], 5]) == [1, 2, 3, 4, 5]


def test_strings_are_atoms():
    assert flatten(["ab", ["cd", ("ef",)]]) == ["ab", "cd", "ef"]


def test_depth():
    assert flatten([1, [2, [3, [4]]]], depth=1) == [1, 2, [3, [4]]]
    assert flatten([1, [2]], depth=0) == [1, [2]]


def test_dicts_are_atoms():
    assert flatten([{"a": 1}, [{"b": 2}]]) == [{"a": 1}, {"b": 2}]
