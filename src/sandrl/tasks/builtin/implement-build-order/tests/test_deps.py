import heapq
import random
import sys

import pytest

sys.path.insert(0, "/workspace")
from deps import CycleError, build_order  # noqa: E402


def ref(deps):
    nodes = set(deps)
    for ds in deps.values():
        nodes.update(ds)
    indeg = {n: 0 for n in nodes}
    users = {n: [] for n in nodes}
    for n, ds in deps.items():
        for d in set(ds):
            indeg[n] += 1
            users[d].append(n)
    heap = [n for n in nodes if indeg[n] == 0]
    heapq.heapify(heap)
    out = []
    while heap:
        n = heapq.heappop(heap)
        out.append(n)
        for u in users[n]:
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(heap, u)
    return out if len(out) == len(nodes) else None


def random_dag(rng, n):
    names = [f"p{i:04d}" for i in range(n)]
    rng.shuffle(names)
    deps = {}
    for i, name in enumerate(names):
        if rng.random() < 0.9:
            deps[name] = rng.sample(names[:i], min(i, rng.randint(0, 4)))
    return deps


def test_example():
    assert build_order({"app": ["lib", "log"], "lib": ["log"], "cli": []}) == ["cli", "log", "lib", "app"]


def test_random_dags():
    rng = random.Random(8)
    for _ in range(300):
        deps = random_dag(rng, rng.randint(0, 30))
        assert build_order(deps) == ref(deps)


def test_duplicate_edges_and_empty():
    assert build_order({}) == []
    assert build_order({"b": ["a", "a"], "a": []}) == ["a", "b"]


def check_cycle(deps, cycle):
    assert len(cycle) >= 1
    for i, node in enumerate(cycle):
        assert cycle[(i + 1) % len(cycle)] in deps.get(node, []), (cycle, node)


def test_cycles():
    cases = [
        {"a": ["b"], "b": ["c"], "c": ["a"]},
        {"x": ["x"]},
        {"a": ["b"], "b": ["a"], "c": ["a"], "d": []},
        {"top": ["m1", "m2"], "m1": ["low"], "m2": ["low", "loop1"], "loop1": ["loop2"], "loop2": ["m2"]},
    ]
    for deps in cases:
        with pytest.raises(CycleError) as info:
            build_order(deps)
        assert isinstance(info.value, ValueError)
        check_cycle(deps, info.value.cycle)


def test_random_cycles():
    rng = random.Random(9)
    for _ in range(100):
        deps = random_dag(rng, 25)
        order = ref(deps)
        a, b = sorted(rng.sample(range(len(order)), 2))
        # order[b] already (transitively or not) may depend on order[a]; add a path back
        deps.setdefault(order[a], []).append(order[b])
        deps.setdefault(order[b], []).append(order[a])
        with pytest.raises(CycleError) as info:
            build_order(deps)
        check_cycle(deps, info.value.cycle)


def test_large_chain_fast():
    n = 5000
    deps = {f"n{i:05d}": [f"n{i - 1:05d}"] for i in range(1, n)}
    assert build_order(deps) == [f"n{i:05d}" for i in range(n)]
