"""An :class:`~sandrl.sandbox.base.ImageSource` made into an image of the store: the bubblewrap
provider's ``resolve_image``.

A source that names a prebuilt image runs in it (a store image by name, else a registry reference
pulled the first time, :mod:`sandrl.sandbox.bwrap.pulled`); one with a Dockerfile is built
(:class:`~.builder.ImageBuilder`; a cache hit when nothing changed); one with neither runs in ``host``.
"""

from __future__ import annotations

import warnings

from sandrl.errors import ConfigError, ImageBuildError, ImageError
from sandrl.sandbox.base import ImageSource
from sandrl.sandbox.bwrap.dockerfile.builder import BuildHost, BuildOptions, ImageBuilder
from sandrl.sandbox.bwrap.images import HOST_IMAGE
from sandrl.sandbox.bwrap.pulled import pull_into_store

MAX_BUILD_DISK_MB = 16384
"""A build step's writable layer is the image's sandboxes' disk, up to this."""
MIN_BUILD_DISK_MB = 1024


def build_options(source: ImageSource) -> BuildOptions:
    """The build of ``source``: its time budget and network, and at least its sandboxes' resources."""
    return BuildOptions(
        timeout_s=source.build_timeout_s,
        network=source.network,
        cpus=max(source.cpus, BuildOptions.cpus),
        memory_mb=max(source.memory_mb, BuildOptions.memory_mb),
        disk_mb=max(min(source.disk_mb, MAX_BUILD_DISK_MB), MIN_BUILD_DISK_MB),
    )


async def image_for(host: BuildHost, source: ImageSource) -> str:
    """The store image ``source``'s sandboxes start from (see the module). A source with both a
    prebuilt image and a Dockerfile (Terminal-Bench 2 pins one beside its Dockerfile) runs in the
    image, as Harbor does without ``--force-build``, and is built only when the image cannot be had."""
    if source.image is not None:
        if host.images.exists(source.image):
            return source.image
        try:
            return await pull_into_store(host.images, source.image)
        except (ConfigError, ImageError) as exc:
            if source.dockerfile_text is None:
                raise ImageBuildError(f"{source.label}: its image {source.image} cannot be had: {exc}") from exc
            warnings.warn(
                f"{source.label}: building its Dockerfile, as its image {source.image} cannot be had: {exc}",
                stacklevel=2,
            )
    if source.dockerfile_text is None:
        return HOST_IMAGE
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
    return result.image
