"""An :class:`~sandrl.sandbox.base.ImageSource` made into an image of the store: the bubblewrap
provider's ``resolve_image``.

A source with a Dockerfile is built (:class:`~.builder.ImageBuilder`; a cache hit when nothing
changed); one without runs in its prebuilt image when the store has it, else in ``host``.
"""

from __future__ import annotations

from sandrl.errors import ImageBuildError
from sandrl.sandbox.base import ImageSource
from sandrl.sandbox.bwrap.dockerfile.builder import BuildHost, BuildOptions, ImageBuilder
from sandrl.sandbox.bwrap.images import HOST_IMAGE

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
    """The store image ``source``'s sandboxes start from, built from its Dockerfile if needed."""
    if source.dockerfile_text is None:
        if source.image is not None and host.images.exists(source.image):
            return source.image
        return HOST_IMAGE
    try:
        result = await ImageBuilder(host).build(
            source.dockerfile, context=source.context_dir, text=source.dockerfile_text, options=build_options(source)
        )
    except ImageBuildError as exc:
        raise ImageBuildError(f"{source.label}: building its environment failed: {exc}") from exc
    return result.image
