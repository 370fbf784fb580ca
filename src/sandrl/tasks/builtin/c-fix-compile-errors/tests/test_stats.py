import random
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

FLAGS = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-O2"]


@pytest.fixture(scope="module")
def binary():
    tmp = Path(tempfile.mkdtemp())
    shutil.copy("/workspace/stats.c", tmp / "stats.c")
    proc = subprocess.run(
        ["gcc", *FLAGS, "-o", str(tmp / "stats"), str(tmp / "stats.c"), "-lm"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == "", proc.stderr
    yield tmp / "stats"
    shutil.rmtree(tmp)


def expected(tokens):
    nums, skipped = [], 0
    for t in tokens:
        try:
            if t.strip() != t or not t:
                raise ValueError
            v = float(t)
            if t.lower() in ("nan", "inf", "-inf", "+inf", "infinity") or "_" in t:
                raise ValueError
            nums.append(v)
        except ValueError:
            skipped += 1
    out = f"count={len(nums)}\nskipped={skipped}\n"
    if not nums:
        return out, 1
    total = 0.0
    for v in nums:
        total += v
    s = sorted(nums)
    n = len(s)
    median = s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
    out += f"min={min(nums):.3f}\nmax={max(nums):.3f}\nmean={total / n:.3f}\nmedian={median:.3f}\n"
    return out, 0


def run(binary, text):
    return subprocess.run([str(binary)], input=text, capture_output=True, text=True, timeout=10)


def test_example(binary):
    proc = run(binary, "3 1 x 4 1\n5 9 2 6\n")
    assert proc.returncode == 0
    assert proc.stdout == "count=8\nskipped=1\nmin=1.000\nmax=9.000\nmean=3.875\nmedian=3.500\n"


def test_empty(binary):
    proc = run(binary, "abc def\n")
    assert proc.returncode == 1
    assert proc.stdout == "count=0\nskipped=2\n"


def test_random(binary):
    rng = random.Random(5)
    for _ in range(60):
        tokens = []
        for _ in range(rng.randint(1, 3000)):
            r = rng.random()
            if r < 0.1:
                tokens.append(rng.choice(["x", "1.2.3", "--", "7q", "abc"]))
            elif r < 0.5:
                tokens.append(str(rng.randint(-1000, 1000)))
            else:
                tokens.append(f"{rng.uniform(-1e4, 1e4):.4f}")
        text = " ".join(tokens) + "\n"
        want, code = expected(tokens)
        proc = run(binary, text)
        assert proc.returncode == code
        assert proc.stdout == want


def test_makefile_builds():
    tmp = Path(tempfile.mkdtemp())
    try:
        shutil.copy("/workspace/stats.c", tmp / "stats.c")
        shutil.copy("/workspace/Makefile", tmp / "Makefile")
        proc = subprocess.run(["make", "-C", str(tmp)], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert (tmp / "stats").exists()
    finally:
        shutil.rmtree(tmp)
