"""The image store: the host image and imported root filesystems."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from sandrl.errors import ConfigError, ImageNotFoundError
from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.sandbox.bwrap.images import ImageStore

from ...support import needs_sandbox


def _tiny_rootfs(root: Path) -> Path:
    """A real, minimal root filesystem: dash and the libraries it links, nothing else."""
    sh = Path(shutil.which("dash") or "/bin/sh").resolve()
    (root / "bin").mkdir(parents=True)
    shutil.copy2(sh, root / "bin" / "sh")
    out = subprocess.run(["ldd", str(sh)], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        parts = line.split()
        lib = next((p for p in parts if p.startswith("/")), None)
        if lib:
            dest = root / lib.lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(lib, dest)
    (root / "etc").mkdir()
    (root / "etc" / "marker").write_text("tiny image\n")
    return root


def test_host_image_plan(tmp_path: Path) -> None:
    store = ImageStore(tmp_path)
    image = store.get("host")
    targets = [t for t, _ in image.plan.overlays]
    assert targets[0] == "/"
    assert "/usr" in targets and "/etc" in targets
    mask = image.plan.layers[image.plan.overlays[-1][1][0]]
    assert (mask / "shadow").exists() or not Path("/etc/shadow").exists()


def test_unknown_image_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ImageNotFoundError, match="no image named 'nope'"):
        ImageStore(tmp_path).get("nope")


def test_bad_names_and_non_rootfs_are_refused(tmp_path: Path) -> None:
    store = ImageStore(tmp_path)
    with pytest.raises(ConfigError):
        store.add_rootfs("host", tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="root filesystem"):
        store.add_rootfs("empty", tmp_path / "empty")


@needs_sandbox
async def test_sandbox_from_an_imported_rootfs(provider: BwrapProvider, tmp_path: Path) -> None:
    provider.images.add_rootfs("tiny-test", _tiny_rootfs(tmp_path / "rootfs"))
    try:
        assert "tiny-test" in provider.images.names()
        async with await provider.create(SandboxSpec(image="tiny-test")) as sb:
            r = await sb.exec("read x < /etc/marker; echo $x; echo new > /etc/marker; read y < /etc/marker; echo $y")
            assert r.stdout == "tiny image\nnew\n"
            assert (await sb.exec("ls /")).exit_code == 127  # no ls in this image: a real, separate rootfs
    finally:
        provider.images.remove("tiny-test")
    assert "tiny-test" not in provider.images.names()
