"""An image with a directory tree of this machine laid over another image, without a build.

A CLI agent's files (Claude Code's 400 MB binary) go into every task image an episode of that agent
starts from. Built as a Dockerfile step (``COPY``), each task image would get a copy of its own. Here
the tree becomes one store layer, named after its ``key`` (made once per store, whoever asks first,
even from another process), and each image over it is only a record: that layer stacked on the
base image (:meth:`~.images.ImageStore.add_image` with ``base``), named after the base and the key.
An image made this way costs no copy and no sandbox, and any number of base images share the layer.

The tree is brought in as :meth:`~.images.ImageStore.add_layer` brings any tree: owners shifted into
the store's uid range, setuid and setgid bits dropped, the store's reserve kept. Its top directories
must not be links (they would hide the base's).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
from pathlib import Path

from sandrl.errors import ConfigError
from sandrl.sandbox.bwrap.images import ImageStore

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,80}$")
_VERSION = "tree-layer-1"
"""Part of every layer id and image name: bump it when the way a tree becomes a layer changes."""


def tree_layer_id(key: str) -> str:
    """The store layer id of the tree ``key`` names."""
    return hashlib.sha256(f"{_VERSION}\0{key}".encode()).hexdigest()[:32]


def image_with_tree(store: ImageStore, base: str, tree: Path, *, key: str, name: str) -> str:
    """The image ``base`` with ``tree`` over its root: ``<name>-<hash>`` in ``store`` (made now if
    it is not there). ``key`` names the tree's content (the same key must mean the same files);
    ``name`` is a readable prefix (``claude-code-2.1.332``)."""
    if not _NAME.match(name):
        raise ConfigError(f"an image name prefix is lower-case letters, digits, '.', '_' and '-', got {name!r}")
    if not tree.is_dir() or tree.is_symlink():
        raise ConfigError(f"{tree} is not a directory to lay over an image")
    for top in tree.iterdir():
        if top.is_symlink():
            raise ConfigError(f"{top} is a link: a tree laid over an image holds directories and files")
    record = store.meta(base)  # raises ImageNotFoundError naming the fix
    layer = tree_layer_id(key)
    image = (
        f"{name}-"
        + hashlib.sha256(json.dumps([_VERSION, base, record.get("created"), layer]).encode()).hexdigest()[:16]
    )
    if store.exists(image) and (store.root / "layers" / layer).is_dir():
        return image
    lock_path = store.root / f".tree-{layer}.lock"
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # one copy of a large tree, however many ask at once
        store.add_layer(tree, layer_id=layer)
    finally:
        os.close(fd)
    store.add_image(image, [layer], base=base, config={"tree": key, "over": base})
    return image
