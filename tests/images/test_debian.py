"""The Debian base image (sandrl.images.debian): debootstrap's root into a real image store.

debootstrap itself needs a Debian mirror, which tests do not reach: a script of that name on
``PATH`` stands in for it (the edge), writing a root as debootstrap does or failing as it does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandrl.errors import ImageBuildError
from sandrl.images.debian import DEBIAN_IMAGE, build_debian
from sandrl.images.manifest import DEFAULT_PATH
from sandrl.sandbox.bwrap.images import ImageStore

from ..support import needs_sandbox

SANDRL = Path(sys.executable).with_name("sandrl")

WRITES_A_ROOT = """#!/bin/sh
# debootstrap --variant=minbase SUITE TARGET MIRROR
echo "debootstrap $*" > "$DEBOOTSTRAP_ARGS"
mkdir -p "$3/bin" "$3/usr/bin" "$3/etc" "$3/var/cache/apt/archives" "$3/var/lib/apt/lists/partial"
echo 12 > "$3/etc/debian_version"
echo deb > "$3/var/cache/apt/archives/bash.deb"
echo list > "$3/var/lib/apt/lists/deb.debian.org_Packages"
"""

FAILS = """#!/bin/sh
i=1; while [ $i -le 40 ]; do echo "I: line $i"; i=$((i+1)); done
echo "E: Failed getting release file $4/dists/$2/Release" >&2
exit 1
"""


def _on_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, script: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "debootstrap"
    tool.write_text(script)
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir


def test_the_root_debootstrap_writes_becomes_the_image(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _on_path(monkeypatch, tmp_path, WRITES_A_ROOT)
    args = tmp_path / "args"
    monkeypatch.setenv("DEBOOTSTRAP_ARGS", str(args))
    store = ImageStore(tmp_path / "state" / "images")
    build_debian(store, {"PATH": DEFAULT_PATH}, suite="trixie", mirror="http://mirror.invalid/debian")
    assert store.exists(DEBIAN_IMAGE)
    assert args.read_text().split()[1:3] == ["--variant=minbase", "trixie"]
    assert args.read_text().split()[-1] == "http://mirror.invalid/debian"
    [layer] = [p for p in (store.root / "layers").iterdir() if (p / "etc" / "debian_version").exists()]
    assert list((layer / "var/cache/apt/archives").iterdir()) == []  # apt's downloads do not ship in the image
    assert [p.name for p in (layer / "var/lib/apt/lists").iterdir()] == ["partial"]
    assert oct(layer.stat().st_mode & 0o777) == oct(0o755)
    assert not [p for p in (store.root / "layers").iterdir() if p.name.startswith(".debootstrap-")]


def test_a_failed_debootstrap_says_why_and_leaves_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _on_path(monkeypatch, tmp_path, FAILS)
    store = ImageStore(tmp_path / "state" / "images")
    with pytest.raises(ImageBuildError) as caught:
        build_debian(store, {"PATH": DEFAULT_PATH}, mirror="http://mirror.invalid/debian")
    message = str(caught.value)
    assert message.startswith("debootstrap failed with exit code 1 (is the mirror reachable?):")
    assert "E: Failed getting release file http://mirror.invalid/debian/dists/bookworm/Release" in message
    assert "I: line 40" in message and "I: line 20" not in message  # the end of its output, bounded
    assert not store.exists(DEBIAN_IMAGE)
    assert not [p for p in (store.root / "layers").iterdir() if p.name.startswith(".debootstrap-")]


def test_without_debootstrap_it_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    store = ImageStore(tmp_path / "state" / "images")
    with pytest.raises(ImageBuildError, match="debootstrap is not installed: apt-get install debootstrap"):
        build_debian(store, {"PATH": DEFAULT_PATH})


@needs_sandbox
def test_sandrl_images_build_debian_builds_it_once(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "debootstrap").write_text(WRITES_A_ROOT)
    (bin_dir / "debootstrap").chmod(0o755)
    env = {
        **os.environ,
        "SANDRL_STATE_DIR": str(tmp_path / "state"),
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "DEBOOTSTRAP_ARGS": str(tmp_path / "args"),
    }

    def build() -> subprocess.CompletedProcess[str]:
        args = [str(SANDRL), "images", "build", "debian"]
        return subprocess.run(args, capture_output=True, text=True, env=env, timeout=60)

    first = build()
    assert first.returncode == 0, first.stderr
    assert "built debian (Debian bookworm minbase) in" in first.stdout
    again = build()
    assert again.returncode == 0, again.stderr
    assert "the image 'debian' exists; remove it first to rebuild (sandrl images rm debian)" in again.stdout
