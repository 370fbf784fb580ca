"""An :class:`~sandrl.sandbox.base.ImageSource` made into an image of the store: the bubblewrap
provider's ``resolve_image``.

A source that names a prebuilt image runs in it (a store image by name, else a registry reference
pulled the first time, :mod:`sandrl.sandbox.bwrap.pulled`); one with a Dockerfile is built
(:class:`~.builder.ImageBuilder`; a cache hit when nothing changed); one with neither runs in ``host``.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable

from sandrl.errors import ConfigError, ImageBuildError, ImageError
from sandrl.images.pull import PullEvent
from sandrl.sandbox.base import IMAGE_NAME_PATTERN, FetchedImage, ImageSource
from sandrl.sandbox.bwrap.dockerfile.builder import BuildHost, BuildOptions, ImageBuilder
from sandrl.sandbox.bwrap.images import HOST_IMAGE
from sandrl.sandbox.bwrap.pulled import pull_into_store, stored_name

MAX_BUILD_DISK_MB = 16384
"""A build step's writable layer is the image's sandboxes' disk, up to this."""
MIN_BUILD_DISK_MB = 1024
_STORE_NAME = re.compile(IMAGE_NAME_PATTERN)


def build_options(source: ImageSource) -> BuildOptions:
    """The build of ``source``: its time budget and network, and at least its sandboxes' resources."""
    return BuildOptions(
        timeout_s=source.build_timeout_s,
        network=source.network,
        cpus=max(source.cpus, BuildOptions.cpus),
        memory_mb=max(source.memory_mb, BuildOptions.memory_mb),
        disk_mb=max(min(source.disk_mb, MAX_BUILD_DISK_MB), MIN_BUILD_DISK_MB),
    )


def cached_image(host: BuildHost, source: ImageSource) -> str | None:
    """The store image ``source``'s prebuilt image is when the store has it whole; else None (also
    for a Dockerfile: only its build can tell a cache hit)."""
    if source.image is None:
        return HOST_IMAGE if source.dockerfile_text is None else None
    if _STORE_NAME.match(source.image) and host.images.exists(source.image):
        return source.image
    try:
        return stored_name(host.images, source.image)
    except ConfigError:
        return None  # not a reference: the pull says so


async def image_for(host: BuildHost, source: ImageSource) -> str:
    """The store image ``source``'s sandboxes start from: :func:`fetch_image`'s name."""
    return (await fetch_image(host, source)).name


async def fetch_image(
    host: BuildHost, source: ImageSource, *, on_bytes: Callable[[int], None] | None = None
) -> FetchedImage:
    """The store image ``source``'s sandboxes start from (see the module), and how it came. A
    source with both a prebuilt image and a Dockerfile (Terminal-Bench 2 pins one beside its
    Dockerfile) runs in the image, as Harbor does without ``--force-build``, and is built only when
    the image cannot be had. ``on_bytes`` hears every chunk a pull downloads."""
    have = cached_image(host, source)
    if have is not None:
        return FetchedImage(have, "host" if have == HOST_IMAGE else "cached")
    if source.image is not None:
        downloaded = 0

        def heard(event: PullEvent) -> None:
            nonlocal downloaded
            if event.kind == "bytes":
                downloaded += event.size
                if on_bytes is not None:
                    on_bytes(event.size)

        try:
            name = await pull_into_store(host.images, source.image, on_event=heard)
            return FetchedImage(name, "pulled", downloaded)
        except (ConfigError, ImageError) as exc:
            if source.dockerfile_text is None:
                raise ImageBuildError(f"{source.label}: its image {source.image} cannot be had: {exc}") from exc
            warnings.warn(
                f"{source.label}: building its Dockerfile, as its image {source.image} cannot be had: {exc}",
                stacklevel=2,
            )
    assert source.dockerfile_text is not None  # cached_image answered host without one
    try:
        result = await ImageBuilder(host).build(
            source.dockerfile,
            context=source.context_dir,
            text=source.dockerfile_text,
            options=build_options(source),
            task=source.name,
        )
    except ImageBuildError as exc:
        raise ImageBuildError(f"{source.label}: building its environment failed: {exc}") from exc
    return FetchedImage(result.image, "built" if result.built else "cached")
