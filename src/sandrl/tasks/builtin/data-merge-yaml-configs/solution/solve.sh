#!/bin/bash
set -euo pipefail
cd /workspace
python3 - <<'PY'
import json

import yaml


def merge(a, b):
    out = dict(a)
    for key, value in b.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict):
            out[key] = merge(out[key] if isinstance(out.get(key), dict) else {}, value)
        else:
            out[key] = value
    return out


def leaves(d, prefix=""):
    for key, value in d.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            yield from leaves(value, path)
        else:
            yield path, value


docs = []
for name in ("base", "production", "eu-west"):
    with open(f"config/{name}.yaml") as f:
        docs.append(yaml.safe_load(f))
result = {}
for doc in docs:
    result = merge(result, doc)
base = dict(leaves(merge({}, docs[0])))
with open("effective.json", "w") as f:
    json.dump(result, f, indent=2)
with open("changed_keys.txt", "w") as f:
    for path in sorted(p for p, v in leaves(result) if p not in base or base[p] != v):
        f.write(path + "\n")
PY
