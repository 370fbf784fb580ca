"""Pulling an image: its manifest for this platform, its config, and each layer once, unpacked.

:func:`pull` works against a :class:`LayerSink` (a backend's image store): layers the sink holds
already are not fetched again (layers are keyed by their blob digest, so images that share a
base share its layers on disk), and two pulls of one layer — two tasks, or two processes — fetch
it once: each layer is taken under a file lock in the sink, and whoever waited finds it there.
Downloads and unpacking of different layers overlap (``concurrency`` layers at a time).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shutil
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from sandrl.errors import LayerError, SandrlError
from sandrl.images.manifest import (
    MAX_CONFIG_BYTES,
    Descriptor,
    ImageConfig,
    Platform,
    host_platform_of,
    parse_config,
    parse_manifest,
    select_platform,
)
from sandrl.images.reference import Reference
from sandrl.images.registry import RegistryClient
from sandrl.images.unpack import LayerPolicy, unpack_layer

__all__ = ["LayerSink", "PullEvent", "PulledImage", "pull"]

_LOCK_POLL_S = 0.05


class LayerSink(Protocol):
    """Where pulled layers go (an image store)."""

    policy: LayerPolicy
    """Owners, modes and xattrs as the store keeps them."""

    def has_layer(self, digest: str) -> bool: ...

    def work_dir(self) -> Path:
        """A private directory on the store's filesystem for downloads, unpack targets and locks."""
        ...

    def commit_layer(self, digest: str, tree: Path) -> None:
        """Make the unpacked ``tree`` (in :meth:`work_dir`) the store's layer of ``digest``."""
        ...


@dataclass(frozen=True)
class PullEvent:
    kind: Literal["resolved", "layer-cached", "layer-start", "bytes", "layer-unpacking", "layer-done"]
    digest: str = ""
    size: int = 0
    """Of a layer event: the blob's size; of ``bytes``: how many bytes came."""
    layers: int = 0
    """Of ``resolved``: how many layers the image has."""


@dataclass(frozen=True)
class PulledImage:
    reference: Reference
    """As asked, with the digest of the manifest it resolved to."""
    digest: str
    """The platform manifest's digest (for an index, the chosen entry's)."""
    index_digest: str | None
    """The index's digest, when the reference named an index."""
    layers: tuple[str, ...]
    """Blob digests, bottom first, as the manifest lists them."""
    config: ImageConfig
    downloaded: tuple[str, ...]
    """The layers this pull fetched (the others were in the sink)."""


async def pull(
    ref: Reference,
    sink: LayerSink,
    *,
    client: RegistryClient,
    platform: Platform | None = None,
    on_event: Callable[[PullEvent], None] | None = None,
    concurrency: int = 3,
) -> PulledImage:
    """Fetch ``ref`` for ``platform`` (default: this host's) into ``sink``."""
    wanted = platform or host_platform_of()
    emit = on_event or (lambda event: None)
    top = await client.manifest(ref)
    manifest = parse_manifest(top.body, top.media_type, str(ref))
    index_digest: str | None = None
    digest = top.digest
    endpoint = top.endpoint
    if manifest.is_index:
        index_digest = top.digest
        chosen = select_platform(manifest, wanted, str(ref))
        fetched = await client.manifest(ref, digest=chosen.digest, endpoint=endpoint)
        manifest = parse_manifest(fetched.body, fetched.media_type, f"{ref} ({wanted})")
        if manifest.is_index:
            raise LayerError(f"{ref}: the index's entry for {wanted} is another index; sandrl reads one level")
        digest, endpoint = fetched.digest, fetched.endpoint
    assert manifest.config is not None
    config = parse_config(
        await client.blob_bytes(ref, manifest.config, endpoint, limit=MAX_CONFIG_BYTES), f"{ref}'s config"
    )
    if len(config.diff_ids) != len(manifest.layers):
        raise LayerError(
            f"{ref}: the manifest lists {len(manifest.layers)} layers but the config {len(config.diff_ids)} diff_ids"
        )
    if config.platform.architecture and not config.platform.matches(wanted):
        raise LayerError(
            f"{ref} is built for {config.platform}, not {wanted}; choose the platform with --platform if it has one"
        )
    emit(PullEvent("resolved", layers=len(manifest.layers)))
    gate = asyncio.Semaphore(max(1, concurrency))
    downloaded: list[str] = []

    async def one(desc: Descriptor, diff_id: str) -> None:
        async with gate:
            if await _fetch_layer(ref, desc, diff_id, endpoint, sink, client, emit):
                downloaded.append(desc.digest)

    try:
        async with asyncio.TaskGroup() as group:
            for desc, diff_id in zip(manifest.layers, config.diff_ids, strict=True):
                group.create_task(one(desc, diff_id))
    except BaseExceptionGroup as group_error:
        raise _first(group_error) from None
    return PulledImage(
        reference=ref.with_digest(index_digest or digest) if ref.digest is None else ref,
        digest=digest,
        index_digest=index_digest,
        layers=tuple(d.digest for d in manifest.layers),
        config=config,
        downloaded=tuple(downloaded),
    )


async def _fetch_layer(
    ref: Reference,
    desc: Descriptor,
    diff_id: str,
    endpoint: str,
    sink: LayerSink,
    client: RegistryClient,
    emit: Callable[[PullEvent], None],
) -> bool:
    """Bring one layer into ``sink`` unless it is there; True when this call fetched it."""
    if sink.has_layer(desc.digest):
        emit(PullEvent("layer-cached", desc.digest, desc.size))
        return False
    work = sink.work_dir()
    name = desc.digest.replace(":", "-")
    async with _file_lock(work / f"{name}.lock"):
        if sink.has_layer(desc.digest):  # another pull brought it while this one waited
            emit(PullEvent("layer-cached", desc.digest, desc.size))
            return False
        emit(PullEvent("layer-start", desc.digest, desc.size))
        blob = work / f"{name}.blob"
        await client.blob_to_file(
            ref, desc, endpoint, blob, on_bytes=lambda n: emit(PullEvent("bytes", desc.digest, n))
        )
        emit(PullEvent("layer-unpacking", desc.digest, desc.size))
        tree = work / f"{name}.tree"
        shutil.rmtree(tree, ignore_errors=True)  # what a killed pull left
        try:
            unpacked = await asyncio.to_thread(_unpack, blob, tree, sink.policy)
            if unpacked != diff_id:
                raise LayerError(
                    f"{ref}: layer {desc.digest} unpacks to {unpacked}, not the {diff_id} its config names: refused"
                )
            sink.commit_layer(desc.digest, tree)
        except BaseException:
            shutil.rmtree(tree, ignore_errors=True)
            raise
        finally:
            blob.unlink(missing_ok=True)  # unpacked or refused: the compressed copy is not kept
        emit(PullEvent("layer-done", desc.digest, desc.size))
        return True


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The error to report of a pull's layers: the first one sandrl raised on purpose, if any."""
    leaves: list[BaseException] = []
    pending: list[BaseException] = [group]
    while pending:
        error = pending.pop(0)
        if isinstance(error, BaseExceptionGroup):
            pending.extend(error.exceptions)
        else:
            leaves.append(error)
    return next((e for e in leaves if isinstance(e, SandrlError)), leaves[0])


def _unpack(blob: Path, tree: Path, policy: LayerPolicy) -> str:
    with open(blob, "rb") as source:
        return unpack_layer(source, tree, policy).diff_id


@contextlib.asynccontextmanager
async def _file_lock(path: Path) -> AsyncIterator[None]:
    """An exclusive ``flock`` on ``path``, waited for without blocking the event loop. flock (not
    fcntl's record locks) excludes other open files of this process too, so it serves both two
    tasks of one process and two processes."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                await asyncio.sleep(_LOCK_POLL_S)
        yield
    finally:
        os.close(fd)
