import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

MASK = (1 << 64) - 1
SOURCES = ["Makefile", "gen_table.py", "main.c"]
GENERATED = ["table.h", "table_index.c", "table_0.c", "table_1.c", "table_2.c", "table_3.c"]


def reference(x):
    state, total = 12345, 0
    for _ in range(2400):
        out = []
        for _ in range(4):
            state = (state * 6364136223846793005 + 1442695040888963407) & MASK
            out.append(state >> 33)
        a, b, s, k = out[0] | 1, out[1], out[2] % 13 + 3, out[3] % 8 + 4
        acc = b
        for j in range(k):
            acc = (acc * a + (x ^ j)) & MASK
            acc ^= acc >> s
        total = (total + acc) & MASK
    return f"{total:016x}"


SHIM = """#!/bin/bash
printf '%s\\n' "$*" >> {log}
exec /usr/bin/{tool} "$@"
"""


@pytest.fixture(scope="module")
def build():
    tmp = Path(tempfile.mkdtemp())
    for name in SOURCES:
        shutil.copy(Path("/workspace") / name, tmp / name)
    # Shims log every python3 and gcc invocation of the build.
    shims = Path(tempfile.mkdtemp())
    for tool in ("python3", "gcc"):
        (shims / tool).write_text(SHIM.format(log=shims / f"{tool}.log", tool=tool))
        (shims / tool).chmod(0o755)
    env = {"PATH": f"{shims}:/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}
    proc = subprocess.run(["make", "-j4"], cwd=tmp, capture_output=True, text=True, timeout=300, env=env)
    logs = {}
    for tool in ("python3", "gcc"):
        log = shims / f"{tool}.log"
        logs[tool] = log.read_text().splitlines() if log.exists() else []
    yield tmp, proc, logs
    shutil.rmtree(tmp)
    shutil.rmtree(shims)


def test_parallel_build_from_clean(build):
    tmp, proc, logs = build
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (tmp / "lookup").is_file()
    generations = [line for line in logs["python3"] if "gen_table.py" in line]
    assert len(generations) <= 1, generations
    compiles = [line.split() for line in logs["gcc"] if " -c " in f" {line} "]
    if not compiles:  # gcc called by its full path: read the commands make printed
        compiles = [line.split() for line in proc.stdout.splitlines() if " -c " in line]
    assert len(compiles) == 6, compiles
    assert all("-O2" in args for args in compiles), compiles


def test_lookup_output(build):
    tmp, proc, _ = build
    assert proc.returncode == 0
    for x in (0, 42, 7, 123456789, 2**63 + 5):
        out = subprocess.run([str(tmp / "lookup"), str(x)], capture_output=True, text=True, timeout=30)
        assert out.stdout.strip() == reference(x)


def test_clean(build):
    tmp, proc, _ = build
    assert proc.returncode == 0
    subprocess.run(["make", "clean"], cwd=tmp, capture_output=True, timeout=60, check=True)
    left = sorted(p.name for p in tmp.iterdir())
    assert left == sorted(SOURCES), left
