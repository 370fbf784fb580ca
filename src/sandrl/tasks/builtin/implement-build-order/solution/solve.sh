#!/bin/bash
set -euo pipefail
cat > /workspace/deps.py <<'PY'
"""Package build ordering."""

import heapq


class CycleError(ValueError):
    def __init__(self, cycle):
        super().__init__("dependency cycle: " + " -> ".join(cycle))
        self.cycle = cycle


def _find_cycle(deps, remaining):
    # Every remaining node has an unfinished dependency: walk until a node repeats.
    node = min(remaining)
    seen = {}
    path = []
    while node not in seen:
        seen[node] = len(path)
        path.append(node)
        node = next(d for d in sorted(set(deps.get(node, []))) if d in remaining)
    return path[seen[node]:]


def build_order(deps):
    nodes = set(deps)
    for ds in deps.values():
        nodes.update(ds)
    indeg = dict.fromkeys(nodes, 0)
    users = {n: [] for n in nodes}
    for node, ds in deps.items():
        for d in set(ds):
            indeg[node] += 1
            users[d].append(node)
    ready = [n for n in nodes if indeg[n] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        node = heapq.heappop(ready)
        order.append(node)
        for user in users[node]:
            indeg[user] -= 1
            if indeg[user] == 0:
                heapq.heappush(ready, user)
    if len(order) != len(nodes):
        raise CycleError(_find_cycle(deps, nodes - set(order)))
    return order
PY
