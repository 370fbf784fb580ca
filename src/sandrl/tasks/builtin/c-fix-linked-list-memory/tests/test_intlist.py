import random
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

FLAGS = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
ENV = {"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:exitcode=99", "PATH": "/usr/bin:/bin"}


@pytest.fixture(scope="module")
def harness():
    tmp = Path(tempfile.mkdtemp())
    shutil.copy("/tests/harness.c", tmp)
    shutil.copy("/workspace/intlist.c", tmp)
    # the original header: the interface is fixed
    (tmp / "intlist.h").write_text(Path("/tests/intlist.h.orig").read_text())
    proc = subprocess.run(
        ["gcc", *FLAGS, "-I", str(tmp), "-o", str(tmp / "harness"), str(tmp / "harness.c"), str(tmp / "intlist.c")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    yield tmp / "harness"
    shutil.rmtree(tmp)


def model(ops):
    lst, out = [], []
    for op in ops:
        kind = op[0]
        if kind == "f":
            lst.insert(0, op[1])
        elif kind == "b":
            lst.append(op[1])
        elif kind == "r":
            before = len(lst)
            lst = [x for x in lst if x != op[1]]
            out.append(f"removed {before - len(lst)}")
        elif kind == "v":
            lst.reverse()
        elif kind == "c":
            lst = []
        elif kind == "s":
            out.append(f"small {len(lst)}:" + "".join(f" {x}" for x in lst[:3]))
        out.append(f"len {len(lst)}/{len(lst)}:" + "".join(f" {x}" for x in lst))
    return "\n".join(out) + ("\n" if out else "")


def run(harness, ops):
    text = "\n".join(" ".join(map(str, op)) for op in ops) + "\n"
    return subprocess.run([str(harness)], input=text, capture_output=True, text=True, timeout=30, env=ENV)


def test_demo_sequence(harness):
    ops = [("b", 3), ("b", 1), ("b", 3), ("b", 3), ("b", 7), ("b", 3), ("r", 3), ("v",), ("s",), ("c",)]
    proc = run(harness, ops)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == model(ops)


@pytest.mark.parametrize("seed", range(12))
def test_random_sequences(harness, seed):
    rng = random.Random(seed)
    ops = []
    for _ in range(rng.randint(1, 300)):
        r = rng.random()
        v = rng.randint(0, 4)
        if r < 0.3:
            ops.append(("b", v))
        elif r < 0.55:
            ops.append(("f", v))
        elif r < 0.75:
            ops.append(("r", v))
        elif r < 0.85:
            ops.append(("v",))
        elif r < 0.95:
            ops.append(("s",))
        else:
            ops.append(("c",))
    proc = run(harness, ops)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == model(ops)
