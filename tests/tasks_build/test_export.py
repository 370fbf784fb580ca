"""export_changes for real: a sandbox's writes become a layer that stacks on the image it came from."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.sandbox.bwrap.export import export_changes, is_empty_layer
from sandrl.sandbox.bwrap.layer_owners import store_id

CHANGES = """
set -e
echo new > /workspace/added.txt
chmod 750 /workspace/added.txt
chown 1000:1001 /workspace/added.txt
ln -s added.txt /workspace/link
mkdir -p /opt/tree/sub && echo a > /opt/tree/sub/a && echo b > /opt/tree/b
echo changed >> /etc/passwd
rm /etc/hostname
mkdir -p /usr/local/share/sandrl-test && echo x > /usr/local/share/sandrl-test/x
"""


async def _prepare_base(provider: BwrapProvider, tmp_path: Path) -> str:
    """An image on host with a directory holding two files, to be replaced and deleted from."""
    async with await provider.create(SandboxSpec(ttl_s=120)) as sandbox:
        result = await sandbox.exec(
            "mkdir -p /srv/old && echo 1 > /srv/old/one && echo 2 > /srv/old/two && echo k > /srv/keep"
        )
        assert result.ok, result
        await export_changes(sandbox, tmp_path / "base")
    layer = provider.images.add_layer(tmp_path / "base", move=True)
    provider.images.add_image("export-base", [layer], base="host")
    return "export-base"


async def test_export_writes_overlay_format(provider: BwrapProvider, tmp_path: Path) -> None:
    base = await _prepare_base(provider, tmp_path)
    async with await provider.create(SandboxSpec(image=base, ttl_s=120)) as sandbox:
        result = await sandbox.exec(
            CHANGES + "rm -rf /srv/old && mkdir /srv/old && echo 3 > /srv/old/three && rm /srv/keep"
        )
        assert result.ok, result
        dest = tmp_path / "layer"
        await export_changes(sandbox, dest)

    added = dest / "workspace" / "added.txt"
    st = added.lstat()
    assert added.read_text() == "new\n"
    assert stat.S_IMODE(st.st_mode) == 0o750
    assert (st.st_uid, st.st_gid) == (store_id(1000), store_id(1001)), "owners are shifted into the store's ids"
    assert os.readlink(dest / "workspace" / "link") == "added.txt"
    assert (dest / "opt" / "tree" / "sub" / "a").read_text() == "a\n"
    assert all(p.lstat().st_uid == store_id(0) for p in (dest / "opt").rglob("*")), "root inside: the store's 0"
    # Changes under the host image's other overlays land at their mount points.
    assert (dest / "etc" / "passwd").read_text().endswith("changed\n")
    assert (dest / "usr" / "local" / "share" / "sandrl-test" / "x").read_text() == "x\n"
    # A deleted file is a whiteout; a replaced directory is opaque.
    for whiteout in (dest / "etc" / "hostname", dest / "srv" / "keep"):
        wst = whiteout.lstat()
        assert stat.S_ISCHR(wst.st_mode) and wst.st_rdev == os.makedev(0, 0), whiteout
    assert os.getxattr(dest / "srv" / "old", "trusted.overlay.opaque") == b"y"
    assert sorted(p.name for p in (dest / "srv" / "old").iterdir()) == ["three"]
    # Nothing of the sandbox's machinery, and none of overlayfs' own bookkeeping, comes along.
    assert not list(dest.glob(".bubblewrap*"))
    for path in [dest, *dest.rglob("*")]:
        if not path.is_symlink():
            assert all(
                not a.startswith("trusted.overlay.") or a == "trusted.overlay.opaque" for a in os.listxattr(path)
            )


async def test_exported_layer_stacks_on_its_base(provider: BwrapProvider, tmp_path: Path) -> None:
    base = await _prepare_base(provider, tmp_path)
    async with await provider.create(SandboxSpec(image=base, ttl_s=120)) as sandbox:
        assert (
            await sandbox.exec(CHANGES + "rm -rf /srv/old && mkdir /srv/old && echo 3 > /srv/old/three && rm /srv/keep")
        ).ok
        await export_changes(sandbox, tmp_path / "layer")
    store = provider.images
    top = store.add_layer(tmp_path / "layer", move=True)
    base_layers = [str(x) for x in store.meta(base)["layers"]]  # type: ignore[union-attr]
    store.add_image("export-stacked", [top, *base_layers], base="host")
    async with await provider.create(SandboxSpec(image="export-stacked", ttl_s=120)) as sandbox:
        result = await sandbox.exec(
            "set -e; cat /workspace/added.txt; stat -c '%a %u:%g' /workspace/added.txt; readlink /workspace/link;"
            "ls /srv/old; test ! -e /srv/keep; test ! -e /etc/hostname; tail -n1 /etc/passwd;"
            "cat /usr/local/share/sandrl-test/x; test -x /usr/bin/python3; echo ok"
        )
    assert result.ok, result
    assert result.stdout.split() == ["new", "750", "1000:1001", "added.txt", "three", "changed", "x", "ok"]


async def test_unchanged_sandbox_exports_an_empty_layer(provider: BwrapProvider, tmp_path: Path) -> None:
    async with await provider.create(SandboxSpec(ttl_s=120)) as sandbox:
        assert (await sandbox.exec("cat /etc/os-release > /dev/null")).ok
        await export_changes(sandbox, tmp_path / "empty")
    assert is_empty_layer(tmp_path / "empty")
