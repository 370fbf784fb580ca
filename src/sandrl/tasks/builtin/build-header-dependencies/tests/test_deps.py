import os
import random
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest


def make(tree, *args):
    return subprocess.run(["make", "-C", str(tree), *args], capture_output=True, text=True, timeout=120)


def objects(tree):
    return {p.stem: p.stat().st_mtime_ns for p in (tree / "build").glob("*.o")}


def run_app(tree):
    return subprocess.run([str(tree / "bin" / "app")], capture_output=True, text=True, timeout=10).stdout


@pytest.fixture()
def tree():
    tmp = Path(tempfile.mkdtemp()) / "proj"
    shutil.copytree("/workspace", tmp, ignore=shutil.ignore_patterns("build", "bin", ".git"))
    for path in list(tmp.rglob("*.d")):
        path.unlink()
    proc = make(tmp, "-j4")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(objects(tmp)) == sorted(p.stem for p in (tmp / "src").glob("*.c"))
    yield tmp
    shutil.rmtree(tmp.parent)


def age(tree):
    """Back-date the tree (sources older than build outputs) so an edit is newer without sleeping."""
    now = time.time()
    for path in tree.rglob("*"):
        if path.is_file():
            top = path.relative_to(tree).parts[0]
            stamp = now - 5 if top in ("build", "bin") else now - 10
            os.utime(path, (stamp, stamp))


def edit(tree, header, old, new):
    path = tree / "include" / header
    text = path.read_text()
    assert re.search(old, text), (header, old)
    path.write_text(re.sub(old, new, text))


def rebuilt_after(tree, change):
    age(tree)
    before = objects(tree)
    change()
    proc = make(tree, "-j4")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    after = objects(tree)
    return {name for name in after if after[name] != before.get(name)}


def clean_output(tree):
    fresh = Path(tempfile.mkdtemp()) / "fresh"
    shutil.copytree(tree, fresh, ignore=shutil.ignore_patterns("build", "bin", "*.d"))
    proc = make(fresh, "-j4")
    assert proc.returncode == 0
    out = run_app(fresh)
    shutil.rmtree(fresh.parent)
    return out


def test_up_to_date_after_build(tree):
    assert make(tree, "-q").returncode == 0


def test_config_change_rebuilds_its_users(tree):
    old_output = run_app(tree)
    scale = random.Random().randint(4, 9)
    rebuilt = rebuilt_after(
        tree, lambda: edit(tree, "config.h", r"#define GRID_SCALE \d+", f"#define GRID_SCALE {scale}")
    )
    assert rebuilt == {"geometry", "units"}
    out = run_app(tree)
    assert out != old_output
    assert out == clean_output(tree)
    assert make(tree, "-q").returncode == 0


def test_indirect_header_change(tree):
    width = random.Random().randint(14, 20)
    rebuilt = rebuilt_after(
        tree, lambda: edit(tree, "format.h", r"#define FIELD_WIDTH \d+", f"#define FIELD_WIDTH {width}")
    )
    assert rebuilt == {"format", "report", "main"}
    out = run_app(tree)
    assert out.splitlines()[0] == "area".ljust(width) + " " + out.splitlines()[0].split()[-1]
    assert out == clean_output(tree)


def test_new_include_is_tracked(tree):
    age(tree)
    src = tree / "src" / "checksum.c"
    src.write_text('#include "config.h"\n' + src.read_text())
    assert make(tree, "-j4").returncode == 0
    rebuilt = rebuilt_after(
        tree, lambda: edit(tree, "config.h", r"#define SAMPLE_COUNT \d+", "#define SAMPLE_COUNT 99")
    )
    assert rebuilt == {"units", "geometry", "checksum"}
    assert "samples      99" in run_app(tree)


def test_clean(tree):
    assert make(tree, "clean").returncode == 0
    assert not (tree / "build").exists() and not (tree / "bin").exists()
    assert make(tree, "-j4").returncode == 0
