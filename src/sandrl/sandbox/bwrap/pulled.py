"""Registry images in the bubblewrap image store: pulled once, named after their reference.

A pulled image is a store image like any other (its layers are whole-rootfs layers, topmost
first, each owned in the store's uid mapping with no setuid bits, overlayfs whiteouts as
whiteouts), recorded under a name made from its reference (:func:`~sandrl.images.reference.store_name`:
``ubuntu:24.04`` → ``ubuntu-24.04-<hash>``) with the reference, the digest it resolved to, the
platform and the config ``docker run`` uses (env, workdir, user, entrypoint, cmd, ports,
healthcheck). Its layers are stored once, by blob digest (``layers/oci-<hex>``), and shared by
every image that has them.

As ``docker build`` without ``--pull``: a reference already in the store is used as it is, with
no network; ``refresh=True`` (``sandrl images pull``) asks the registry again.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

from sandrl.errors import ConfigError, ImageNotFoundError, SandboxError
from sandrl.images.manifest import DEFAULT_PATH, Platform
from sandrl.images.pull import PullEvent, pull
from sandrl.images.reference import parse_reference, store_name
from sandrl.images.registry import RegistryClient
from sandrl.images.unpack import LayerPolicy, unpack_layer
from sandrl.sandbox.bwrap.images import ImageStore
from sandrl.sandbox.bwrap.layer_owners import kept_xattr, layer_mode, store_id

__all__ = ["import_rootfs_tar", "layer_id", "pull_into_store", "stored_name"]

WORK_DIR = ".pull"
"""Under ``layers/``: downloads, unpack targets and layer locks (the store's filesystem, 0700)."""


def layer_id(digest: str) -> str:
    algorithm, _, hexa = digest.partition(":")
    return f"oci-{hexa}" if algorithm == "sha256" else f"oci-{algorithm}-{hexa}"


class _StoreLayers:
    """:class:`~sandrl.images.pull.LayerSink` over an :class:`ImageStore`."""

    def __init__(self, store: ImageStore) -> None:
        self.store = store
        self.policy = LayerPolicy(owner=store_id, mode=layer_mode, keep_xattr=kept_xattr)

    def has_layer(self, digest: str) -> bool:
        return (self.store.root / "layers" / layer_id(digest)).is_dir()

    def work_dir(self) -> Path:
        work = self.store.root / "layers" / WORK_DIR
        work.mkdir(mode=0o700, exist_ok=True)
        return work

    def commit_layer(self, digest: str, tree: Path) -> None:
        target = self.store.root / "layers" / layer_id(digest)
        try:
            os.rename(tree, target)
        except OSError as exc:
            if target.is_dir():  # pulled meanwhile by a process that did not take the lock
                shutil.rmtree(tree, ignore_errors=True)
                return
            raise SandboxError(f"cannot move a pulled layer into the image store at {target} ({exc})") from exc


def stored_name(store: ImageStore, reference: str, platform: Platform | None = None) -> str | None:
    """The store image of ``reference`` when the store holds it whole (every layer), else None."""
    name = store_name(parse_reference(reference), platform)
    if not store.exists(name):
        return None
    try:
        store.get(name)
    except ImageNotFoundError:
        return None  # a layer of it was removed (pruned by hand, a disk cleaned): it must be pulled again
    return name


async def pull_into_store(
    store: ImageStore,
    reference: str,
    *,
    platform: Platform | None = None,
    refresh: bool = False,
    client: RegistryClient | None = None,
    on_event: Callable[[PullEvent], None] | None = None,
) -> str:
    """The store image of ``reference``, pulled unless it is there (or ``refresh``); its name."""
    ref = parse_reference(reference)
    name = store_name(ref, platform)
    if not refresh and stored_name(store, reference, platform) is not None:
        return name
    own_client = client is None
    registry = client or RegistryClient()
    try:
        pulled = await pull(ref, _StoreLayers(store), client=registry, platform=platform, on_event=on_event)
    finally:
        if own_client:
            await registry.aclose()
    config = pulled.config
    record: dict[str, object] = {
        "source": str(ref),
        "resolved": str(pulled.reference),
        "digest": pulled.digest,
        "index_digest": pulled.index_digest,
        **config.to_record(),
    }
    store.add_image(
        name,
        [layer_id(d) for d in reversed(pulled.layers)],
        env=config.env,
        workdir=config.workdir,
        config=record,
    )
    return name


def import_rootfs_tar(store: ImageStore, tar_path: Path, name: str) -> str:
    """Make the root filesystem in ``tar_path`` (``docker export`` output; gzip or zstd too) the
    image ``name``: unpacked as a pulled layer is, so no path leaves it and no setuid bit stays."""
    store.check_name(name)
    if not tar_path.is_file():
        raise ConfigError(f"{tar_path} is not a file; give a tar archive of a root filesystem")
    sink = _StoreLayers(store)
    tree = sink.work_dir() / f"import-{uuid.uuid4().hex}.tree"
    try:
        with open(tar_path, "rb") as source:
            stats = unpack_layer(source, tree, sink.policy)
        digest = stats.diff_id
        if not sink.has_layer(digest):
            sink.commit_layer(digest, tree)
    finally:
        shutil.rmtree(tree, ignore_errors=True)
    store.add_image(
        name, [layer_id(digest)], env={"PATH": DEFAULT_PATH}, workdir="/", config={"source": f"import:{tar_path}"}
    )
    return name
