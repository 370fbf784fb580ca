"""A directory tree laid over images without a build (:mod:`sandrl.sandbox.bwrap.tree_layers`): one layer
per key, however many images and callers ask; each image a record over its base; the tree's files as a
sandbox sees them, owned by its root, never setuid; a tree that would hide the base refused."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from sandrl.errors import ConfigError, ImageNotFoundError
from sandrl.sandbox.base import SandboxSpec, TreeLayering
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.sandbox.bwrap.tree_layers import tree_layer_id


def make_tree(root: Path) -> Path:
    tool = root / "opt" / "vendor" / "bin" / "tool"
    tool.parent.mkdir(parents=True)
    tool.write_text("#!/bin/sh\necho tool ran\n")
    os.chmod(tool, 0o4755)  # setuid in the tree: never in the layer
    return root


async def test_a_tree_is_one_layer_under_every_image_it_tops(provider: BwrapProvider, tmp_path: Path) -> None:
    assert isinstance(provider, TreeLayering)
    tree = make_tree(tmp_path / "tree")
    base_two = f"tree-base-{os.getpid()}"
    provider.images.add_image(base_two, [], base="host")
    key = f"vendor-tool-1-{tmp_path.name}"
    names = await asyncio.gather(
        *(provider.layer_tree(base, tree, key=key, name="vendor-1") for base in ("host", "host", base_two, base_two))
    )
    assert names[0] == names[1] and names[2] == names[3] and names[0] != names[2]
    layer = tree_layer_id(key)
    for name, base in ((names[0], "host"), (names[2], base_two)):
        record = provider.images.meta(name)
        assert record["layers"] == [layer] and record["base"] == base and name.startswith("vendor-1-")
    assert not list((provider.images.root / "layers").glob(f".{layer}*"))  # no copy left half-made
    async with await provider.create(SandboxSpec(image=names[2])) as sandbox:
        result = await sandbox.exec("/opt/vendor/bin/tool && stat -c '%u %a' /opt/vendor/bin/tool && ls /usr/bin/env")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == ["tool ran", "0 755", "/usr/bin/env"]  # root's, not setuid; base intact


async def test_bad_trees_and_bases_are_refused(provider: BwrapProvider, tmp_path: Path) -> None:
    linked = tmp_path / "linked"
    linked.mkdir()
    os.symlink("/etc", linked / "opt")
    with pytest.raises(ConfigError, match="is a link"):
        await provider.layer_tree("host", linked, key="linked", name="linked")
    with pytest.raises(ImageNotFoundError, match="no image named"):
        await provider.layer_tree("no-such-image", make_tree(tmp_path / "t2"), key="k2", name="n")
    with pytest.raises(ConfigError, match="image name prefix"):
        await provider.layer_tree("host", make_tree(tmp_path / "t3"), key="k3", name="Bad Name")
    with pytest.raises(ConfigError, match="32 hex digits"):
        provider.images.add_layer(make_tree(tmp_path / "t4"), layer_id="../../etc")
