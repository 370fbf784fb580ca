import hashlib
import json
from pathlib import Path

import yaml

CONF = Path("/workspace/config")
SHAS = {
    "base.yaml": "14b84c7ed8617469c31dafb63f45258087e8d86c767a7dd6c73c69cb94bc4e5b",
    "production.yaml": "d3e5f51a083c6033439b5a603826a6c142f25b040e8767f145a91a79f4c8f269",
    "eu-west.yaml": "283702bae62a4958736c5d1b52144a65a8530fcfa0ab83cdd4b42a70e522c690",
}


def merge(a, b):
    out = dict(a)
    for key, value in b.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        elif isinstance(value, dict):
            out[key] = merge({}, value)
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


def expected():
    docs = [yaml.safe_load((CONF / f"{name}.yaml").read_text()) for name in ("base", "production", "eu-west")]
    result = {}
    for doc in docs:
        result = merge(result, doc)
    base = dict(leaves(merge({}, docs[0])))
    changed = sorted(p for p, v in leaves(result) if p not in base or base[p] != v)
    return result, changed


def test_inputs_untouched():
    for name, sha in SHAS.items():
        assert hashlib.sha256((CONF / name).read_bytes()).hexdigest() == sha


def test_effective():
    result, _ = expected()
    assert json.loads(Path("/workspace/effective.json").read_text()) == result


def test_changed_keys():
    _, changed = expected()
    got = [line.strip() for line in Path("/workspace/changed_keys.txt").read_text().splitlines() if line.strip()]
    assert got == changed
