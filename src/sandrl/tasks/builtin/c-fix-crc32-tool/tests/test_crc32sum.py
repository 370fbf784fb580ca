import os
import random
import shutil
import subprocess
import tempfile
import zlib
from pathlib import Path

import pytest

FLAGS = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-O2"]


@pytest.fixture(scope="module")
def tool():
    tmp = Path(tempfile.mkdtemp())
    shutil.copy("/workspace/crc32sum.c", tmp / "crc32sum.c")
    proc = subprocess.run(
        ["gcc", *FLAGS, "-o", str(tmp / "crc32sum"), str(tmp / "crc32sum.c")], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    yield tmp
    shutil.rmtree(tmp)


def write_files(tmp, rng, count):
    paths = []
    for i in range(count):
        size = rng.choice([0, 1, 7, 255, 256, 4096, 70000])
        data = bytes(rng.randrange(256) for _ in range(size))
        if i % 3 == 0 and size:
            data = b"\xff" * (size // 2) + data[size // 2 :]
        p = tmp / f"file {i}.bin"
        p.write_bytes(data)
        paths.append(p)
    return paths


def test_checksums(tool):
    rng = random.Random(77)
    paths = write_files(tool, rng, 18)
    proc = subprocess.run([str(tool / "crc32sum"), *map(str, paths)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    want = "".join(f"{zlib.crc32(p.read_bytes()):08x}  {p}\n" for p in paths)
    assert proc.stdout == want


def test_all_byte_values(tool):
    p = tool / "bytes.bin"
    p.write_bytes(bytes(range(256)) * 3 + b"\xff\xff\x00")
    proc = subprocess.run([str(tool / "crc32sum"), str(p)], capture_output=True, text=True, timeout=30)
    assert proc.stdout == f"{zlib.crc32(p.read_bytes()):08x}  {p}\n"


def test_missing_file_reported(tool):
    a = tool / "a.txt"
    a.write_bytes(b"hello\n")
    b = tool / "b.txt"
    b.write_bytes(os.urandom(100) + b"\xff")
    missing = tool / "does-not-exist"
    proc = subprocess.run(
        [str(tool / "crc32sum"), str(a), str(missing), str(b)], capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 1
    assert proc.stdout == f"{zlib.crc32(a.read_bytes()):08x}  {a}\n{zlib.crc32(b.read_bytes()):08x}  {b}\n"
    assert "does-not-exist" in proc.stderr


def test_success_status(tool):
    a = tool / "c.txt"
    a.write_bytes(b"")
    proc = subprocess.run([str(tool / "crc32sum"), str(a)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0
    assert proc.stdout == f"00000000  {a}\n"
