import os
import random
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

SCRIPT = Path("/workspace/bin/linecount.sh")


def run(*args, cwd="/"):
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=30, cwd=cwd)


def make_tree(rng, root):
    names = ["a", "b c", "d", ".hidden", "sub dir", "x"]
    files = []
    for _ in range(rng.randint(0, 25)):
        depth = rng.randint(0, 3)
        parts = [rng.choice(names) for _ in range(depth)]
        name = rng.choice(["f", "g h", "main", ".dot", "tricky.py.txt", "py"]) + str(rng.randint(0, 99))
        name += rng.choice([".py", ".py", ".txt", ".pyc", "", ".PY"])
        path = root.joinpath(*parts, name)
        if any(p.is_file() for p in path.parents if root in p.parents or p == root):
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            continue
        lines = rng.randint(0, 30)
        body = "".join(f"line {i}\n" for i in range(lines))
        if rng.random() < 0.2:
            body += "no newline at end"
        path.write_text(body)
        files.append(path)
    return files


def expected(root, ext):
    rows = []
    for dirpath, _, filenames in os.walk(root):
        for fn in filenames:
            p = Path(dirpath) / fn
            if fn.endswith("." + ext) and p.is_file():
                rows.append((str(p.relative_to(root)).encode(), p.read_bytes().count(b"\n")))
    rows.sort()
    out = "".join(f"{n}\t{rel.decode()}\n" for rel, n in rows)
    return out + f"total\t{sum(n for _, n in rows)}\n"


def test_executable():
    assert SCRIPT.is_file() and os.access(SCRIPT, os.X_OK)


@pytest.mark.parametrize("seed", range(15))
def test_random_trees(seed):
    rng = random.Random(seed)
    root = Path(tempfile.mkdtemp()) / "tree root"
    root.mkdir()
    try:
        make_tree(rng, root)
        for ext in ("py", "txt"):
            proc = run(str(root), ext, cwd=rng.choice(["/", "/tmp", str(root)]))
            assert proc.returncode == 0, proc.stderr
            assert proc.stdout == expected(root, ext)
    finally:
        shutil.rmtree(root.parent)


def test_relative_dir_argument():
    base = Path(tempfile.mkdtemp())
    try:
        (base / "proj" / "src").mkdir(parents=True)
        (base / "proj" / "src" / "m.py").write_text("a\nb\n")
        proc = run("proj", "py", cwd=str(base))
        assert proc.stdout == "2\tsrc/m.py\ntotal\t2\n"
    finally:
        shutil.rmtree(base)


def test_nothing_matches():
    base = Path(tempfile.mkdtemp())
    try:
        (base / "a.txt").write_text("x\n")
        proc = run(str(base), "py")
        assert proc.returncode == 0
        assert proc.stdout == "total\t0\n"
    finally:
        shutil.rmtree(base)


def test_usage_errors():
    for args in ((), ("/tmp",), ("/tmp", "py", "extra")):
        proc = run(*args)
        assert proc.returncode == 2, args
        assert proc.stderr.strip() and not proc.stdout.strip()
    proc = run("/nonexistent/dir", "py")
    assert proc.returncode == 1 and proc.stderr.strip()
    f = Path(tempfile.mkdtemp()) / "file"
    f.write_text("x")
    assert run(str(f), "py").returncode == 1
