"""The image store never holds a file a host user could use: owners in the store's own uid
range (never host root), no setuid/setgid files, and directories closed to other host users.

Adversarial: every store here sits in a world-traversable directory, as ``/var/lib/sandrl``
does, so that only the store's own protections stand between a host user and its layers.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider, images
from sandrl.sandbox.bwrap.images import ImageStore

from ...support import needs_sandbox
from .hostuser import as_nobody, layer_entries, outside_range, setid_files, world_traversable_dir
from .test_images import _tiny_rootfs

pytestmark = needs_sandbox


@pytest.fixture
def open_dir() -> Iterator[Path]:
    path = world_traversable_dir(Path("/tmp"), f"sandrl-test-{uuid.uuid4().hex[:12]}")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _store_dirs_closed(root: Path) -> None:
    for d in (root, root / "images", root / "layers", root / "host"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, f"{d} is open to host users"
        assert d.stat().st_uid == 0


def test_host_users_cannot_plant_files_in_the_host_skeleton(open_dir: Path) -> None:
    store = ImageStore(open_dir / "images")
    skeleton = store.get("host").plan.layers[0]
    for rel in ("tmp", "var/tmp", "workspace"):
        planted = skeleton / rel / "planted-by-a-host-user"
        result = as_nobody("sh", "-c", f"echo x > {planted}")
        assert result.returncode != 0 and not planted.exists(), f"a host user wrote into {rel} of every sandbox"
    _store_dirs_closed(store.root)
    entries = layer_entries(store.root)
    assert entries and outside_range(entries, images.STORE_UID_BASE) == []


def _hostile_rootfs(root: Path) -> Path:
    """A rootfs as debootstrap leaves it: owned by host root, with a setuid-root binary."""
    _tiny_rootfs(root)
    suid = root / "bin" / "suid-sh"
    shutil.copy2(root / "bin" / "sh", suid)
    os.chmod(suid, 0o4755)
    sgid = root / "bin" / "sgid-sh"
    shutil.copy2(root / "bin" / "sh", sgid)
    os.chmod(sgid, 0o2755)
    user_file = root / "etc" / "user-file"
    user_file.write_text("mine\n")
    os.chown(user_file, 1000, 1001)
    far = root / "etc" / "far-owner"
    far.write_text("far\n")
    os.chown(far, 300000, 300000)
    os.mknod(root / "etc" / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    os.symlink("sh", root / "bin" / "link")
    os.chown(root / "bin" / "link", 0, 0, follow_symlinks=False)
    return root


@pytest.mark.parametrize("move", [False, True])
def test_imported_rootfs_is_shifted_and_stripped(open_dir: Path, tmp_path: Path, move: bool) -> None:
    store = ImageStore(open_dir / "images")
    source = _hostile_rootfs(tmp_path / "rootfs")
    image = store.add_rootfs("hostile", source, move=move)
    layer = image.plan.layers[0]
    entries = [layer, *layer.rglob("*")]
    assert setid_files(entries) == []
    assert as_nobody("test", "-e", str(layer / "bin" / "suid-sh")).returncode != 0
    base = images.STORE_UID_BASE
    assert outside_range(entries, base) == []
    st = (layer / "etc" / "user-file").lstat()
    assert (st.st_uid, st.st_gid) == (base + 1000, base + 1001)
    assert (layer / "bin" / "suid-sh").lstat().st_uid == base
    assert stat.S_IMODE((layer / "bin" / "suid-sh").lstat().st_mode) == 0o755
    assert (layer / "etc" / "far-owner").lstat().st_uid == base + 65534, "unmappable owners become nobody"
    assert not (layer / "etc" / "null").exists(), "a device node has no use in a layer"
    _store_dirs_closed(store.root)
    assert image.plan.store_layers == frozenset({0})


def _old_store(root: Path) -> tuple[Path, Path]:
    """A store as sandrl wrote it before: layers owned by host root, a setuid file, open directories."""
    layer_id = uuid.uuid4().hex
    layer = root / "layers" / layer_id
    _hostile_rootfs(layer)
    (root / "images").mkdir()
    (root / "images" / "old.json").write_text(json.dumps({"name": "old", "layers": [layer_id], "env": {}}))
    skeleton = root / "host" / "skeleton-0123456789abcdef"
    (skeleton / "tmp").mkdir(parents=True)
    os.chmod(skeleton / "tmp", 0o1777)
    for d in (root, root / "images", root / "layers", root / "host", layer):
        os.chmod(d, 0o755)
    return layer, skeleton


def test_existing_store_is_migrated_once(open_dir: Path) -> None:
    root = open_dir / "images"
    layer, skeleton = _old_store(root)
    assert as_nobody("test", "-u", str(layer / "bin" / "suid-sh")).returncode == 0  # the old danger, for real
    store = ImageStore(root)
    entries = layer_entries(root)
    assert setid_files(entries) == []
    assert as_nobody("sh", "-c", f"echo x > {skeleton}/tmp/planted").returncode != 0
    base = images.STORE_UID_BASE
    assert outside_range(entries, base) == []
    assert (layer / "etc" / "user-file").lstat().st_uid == base + 1000
    _store_dirs_closed(root)
    assert store.get("old").plan.store_layers == frozenset({0})
    # Once: a second store on the same directory finds it done (and changes nothing).
    before = {p: p.lstat() for p in entries}
    ImageStore(root)
    assert {p: p.lstat() for p in entries} == before


async def test_sandbox_view_of_store_layers_is_unchanged(open_dir: Path, tmp_path: Path) -> None:
    """Inside, a shifted layer shows its owners and modes as before (setuid aside)."""
    provider = BwrapProvider(open_dir / "state")
    try:
        provider.images.add_rootfs("hostile", _hostile_rootfs(tmp_path / "rootfs"))
        async with await provider.create(SandboxSpec(image="hostile", ttl_s=60, workdir="/")) as sandbox:
            result = await sandbox.exec(
                "read x < /etc/user-file; echo $x; "
                # the tiny image has no stat: sh's own test tells owners apart
                "test -O /bin/suid-sh && echo root-owned; test -u /bin/suid-sh || echo no-suid; "
                "test -O /etc/user-file || echo not-root-owned; echo new > /etc/user-file && echo writable"
            )
        assert result.exit_code == 0, result
        assert result.stdout.split() == ["mine", "root-owned", "no-suid", "not-root-owned", "writable"]
    finally:
        provider._close_all_sync()
