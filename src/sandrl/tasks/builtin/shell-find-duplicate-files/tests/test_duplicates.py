import hashlib
from collections import defaultdict
from pathlib import Path

ROOT = Path("/workspace/files")
TREE_SHA256 = "981f79f77788245b8951b2f4c3c1ba97cfe9d97031216250cd00b84d4f2ca2e8"


def tree_fingerprint():
    files = sorted(p.relative_to(ROOT.parent) for p in ROOT.rglob("*") if p.is_file())
    text = "".join(f"{p}:{hashlib.sha256((ROOT.parent / p).read_bytes()).hexdigest()}\n" for p in files)
    return hashlib.sha256(text.encode()).hexdigest()


def expected():
    groups = defaultdict(list)
    for p in ROOT.rglob("*"):
        if p.is_file() and not p.is_symlink():
            groups[hashlib.sha256(p.read_bytes()).hexdigest()].append(str(p.relative_to(ROOT)).encode())
    lines = [b" ".join(sorted(g)).decode() for g in groups.values() if len(g) > 1]
    return sorted(lines, key=lambda line: line.split(" ")[0].encode())


def test_tree_untouched():
    assert tree_fingerprint() == TREE_SHA256


def test_duplicates():
    out = Path("/workspace/duplicates.txt")
    assert out.is_file(), "duplicates.txt is missing"
    lines = [line.strip() for line in out.read_text().splitlines() if line.strip()]
    want = expected()
    assert len(want) > 5
    assert lines == want
