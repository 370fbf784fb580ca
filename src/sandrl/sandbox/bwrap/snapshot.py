"""Snapshots and forks of live bubblewrap sandboxes: their filesystem, as new images of the store.

A snapshot freezes the sandbox (cgroup freezer: every process stops where it is, so no file is
half-written in the copy), exports its writable layer as a new read-only layer
(:func:`~sandrl.sandbox.bwrap.export.export_changes`), thaws it, and registers an image made of
that layer over the sandbox's own image: the image chain stays shared, only the changes are new.
Any later create can start from it. A fork is one snapshot and ``n`` sandboxes created from it,
each with the parent's limits and its own copy-on-write layer; the parent keeps running.

What a snapshot does not hold: processes, memory, open sockets (a filesystem snapshot, like
``docker commit``). A fork's children start no ``ENTRYPOINT``: they are the parent's files, not a
new container of the parent's image. Process snapshots with CRIU are not offered: the CRIU
that Debian 12 ships (3.17.1) cannot even start on kernels from 6.13 on (their ``[vvar_vclock]``
mapping), whatever the namespaces; ``docs/sandbox-limits.md`` has the error and what a newer CRIU
would still face here.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import shutil
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Protocol

from sandrl.errors import ConfigError, ImageNotFoundError
from sandrl.sandbox.base import FORK_IMAGE_PREFIX, SandboxSpec
from sandrl.sandbox.bwrap.export import export_changes, is_empty_layer
from sandrl.sandbox.bwrap.images import HOST_IMAGE, Image, ImageStore
from sandrl.sandbox.bwrap.sandbox import BwrapSandbox

__all__ = [
    "FORK_PREFIX",
    "SNAPSHOT_PREFIX",
    "SnapshotRecord",
    "fork_sandbox",
    "layers_in_use",
    "list_snapshots",
    "remove_snapshot",
    "snapshot_record",
    "snapshot_sandbox",
]

SNAPSHOT_PREFIX = "snap-"
FORK_PREFIX = FORK_IMAGE_PREFIX
"""Images made for a fork: ``sandrl images prune`` removes them once no live sandbox uses them."""
MAX_FORK = 256


class Creates(Protocol):
    images: ImageStore

    async def create_from(self, spec: SandboxSpec, image: Image) -> BwrapSandbox: ...

    def expect_forks(self, spec: SandboxSpec, n: int, until: asyncio.Future[None] | None = None) -> None: ...


async def snapshot_sandbox(store: ImageStore, sandbox: BwrapSandbox, name: str | None = None) -> str:
    """The image of ``sandbox``'s filesystem as it is now (see the module); its name."""
    name = name or f"{SNAPSHOT_PREFIX}{sandbox.id.removeprefix('sb-')}-{uuid.uuid4().hex[:8]}"
    store.check_name(name)
    if store.exists(name):
        raise ConfigError(f"an image named {name!r} exists; give the snapshot another name")
    layer_dir = store.root / "layers" / f".snapshot-{uuid.uuid4().hex}"
    was_paused = sandbox.paused
    try:
        if not was_paused:
            await asyncio.to_thread(sandbox._group.freeze, True)
        try:
            await export_changes(sandbox, layer_dir, reserve=store.reserve)
        finally:
            if not was_paused:
                await asyncio.to_thread(sandbox._group.freeze, False)
        base_meta = store.meta(sandbox.spec.image)
        below = base_meta.get("layers")
        layers = [str(x) for x in below] if isinstance(below, list) else []
        base = HOST_IMAGE if sandbox.spec.image == HOST_IMAGE else base_meta.get("base")
        if not is_empty_layer(layer_dir):
            layers.insert(0, store.add_layer(layer_dir, move=True))
        config = base_meta.get("config")
        store.add_image(
            name,
            layers,
            env=store.get(sandbox.spec.image).env if base is None else _own_env(base_meta),
            workdir=str(base_meta["workdir"]) if base_meta.get("workdir") else None,
            base=str(base) if base is not None else None,
            config={**(config if isinstance(config, dict) else {}), "snapshot_of": sandbox.id},
        )
    finally:
        if layer_dir.exists():  # what a failed export (one over its bounds) left: no partial layer stays
            await asyncio.to_thread(shutil.rmtree, layer_dir, True)
    return name


def _own_env(meta: dict[str, object]) -> dict[str, str]:
    """The environment a stacked image adds to its base (the base's own is added back by the store)."""
    env = meta.get("env")
    return {str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {}


async def fork_sandbox(provider: Creates, sandbox: BwrapSandbox, n: int) -> list[BwrapSandbox]:
    """``n`` new sandboxes whose filesystems start from ``sandbox``'s current state."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_FORK:
        raise ConfigError(f"a fork makes between 1 and {MAX_FORK} sandboxes, got {n!r}")
    image = await snapshot_sandbox(provider.images, sandbox, f"{FORK_PREFIX}{uuid.uuid4().hex[:16]}")
    spec = replace(sandbox.spec, image=image, entrypoint=False)
    resolved = provider.images.get(image)  # once for all the children: the same image, the same moment
    # Keep launches made ahead for the next fork like this one, made once this fork's children have
    # started (each has run its first command): until then the refill would only compete with them.
    started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    provider.expect_forks(spec, n, until=started)
    made = await asyncio.gather(*(provider.create_from(spec, resolved) for _ in range(n)), return_exceptions=True)
    children = [c for c in made if isinstance(c, BwrapSandbox)]
    failed = [c for c in made if isinstance(c, BaseException)]
    if failed:
        started.set_result(None)
        await asyncio.gather(*(c.close() for c in children), return_exceptions=True)
        raise failed[0]
    asyncio.gather(*(c.first_command_ended for c in children)).add_done_callback(functools.partial(_settle, started))
    return children


def _settle(started: asyncio.Future[None], _: object) -> None:
    if not started.done():
        started.set_result(None)


@dataclass(frozen=True)
class SnapshotRecord:
    """A snapshot in the store: its image name, the sandbox it was taken of, when."""

    name: str
    source: str
    created: float


def snapshot_record(store: ImageStore, name: str) -> SnapshotRecord | None:
    """The record of image ``name`` if a snapshot made it (a fork's image included), else None."""
    if name == HOST_IMAGE:
        return None
    try:
        meta = store.meta(name)
    except (ImageNotFoundError, ValueError, OSError):
        return None
    config = meta.get("config")
    source = config.get("snapshot_of") if isinstance(config, dict) else None
    if not isinstance(source, str):
        return None
    created = meta.get("created")
    return SnapshotRecord(name, source, float(created) if isinstance(created, int | float) else 0.0)


def list_snapshots(store: ImageStore) -> list[SnapshotRecord]:
    """The snapshots in the store, oldest first; the images forks made for themselves are not listed."""
    found = [snapshot_record(store, name) for name in store.names() if not name.startswith(FORK_PREFIX)]
    return sorted((r for r in found if r is not None), key=lambda r: (r.created, r.name))


def remove_snapshot(store: ImageStore, name: str, in_use: set[str]) -> list[str]:
    """Forget the snapshot image ``name`` and delete the layers only it held; return their ids.

    A layer another image lists (a snapshot of a sandbox made from this one) or that a live
    sandbox has mounted (``in_use``: layer ids, :func:`layers_in_use`) stays; ``sandrl images prune``
    removes it once nothing uses it. Only images snapshots (and forks) made are removed this way.
    """
    if snapshot_record(store, name) is None:
        store.meta(name)  # no such image: ImageNotFoundError
        raise ConfigError(f"{name!r} is not an image a snapshot made: remove other images with `sandrl images rm`")
    below = store.meta(name).get("layers")
    own = [str(x) for x in below] if isinstance(below, list) else []
    store.remove(name)
    listed: set[str] = set()
    for other in store.names():
        layers: object = None
        if other != HOST_IMAGE:
            with contextlib.suppress(ImageNotFoundError, ValueError, OSError):
                layers = store.meta(other).get("layers")
        if isinstance(layers, list):
            listed.update(str(x) for x in layers)
    removed = []
    for lid in own:
        path = store.root / "layers" / lid
        if lid in listed or lid in in_use or not path.is_dir():
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(lid)
    return removed


def layers_in_use(store: ImageStore, sandboxes: Iterable[BwrapSandbox]) -> set[str]:
    """The ids of the store's layers that ``sandboxes`` have mounted (a stacked layer is mounted by
    its subdirectories, one per overlay: ``<layer>/usr``)."""
    layers = store.root / "layers"
    found: set[str] = set()
    for sandbox in sandboxes:
        for path in sandbox.mount_plan.layers if sandbox.mount_plan is not None else ():
            if path.is_relative_to(layers):
                found.add(path.relative_to(layers).parts[0])
    return found
