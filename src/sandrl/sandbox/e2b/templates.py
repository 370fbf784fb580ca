"""Images as E2B templates: the name an :class:`~sandrl.sandbox.base.ImageSource` has on an
E2B-compatible service, and how a sandrl host gets an image of that name.

An E2B service starts sandboxes from *templates* it already holds; it builds nothing on a
client's behalf while a rollout runs. So each task's image is a template name, fixed by what
the image is made of, and the service must hold that template before the run:

- a task with no Dockerfile, or one that only says ``FROM host`` and where to work, runs in
  ``base`` (E2B's default template; sandrl's service serves its ``host`` image under that name);
- a task naming a prebuilt image runs in the template of that image's store name (on a sandrl
  host: ``sandrl images pull REF`` there makes it);
- a task with a real Dockerfile runs in ``sandrl-<digest>``, the digest of its Dockerfile and
  every file of its build context: a changed task is a new template, never a stale one. On a
  sandrl host ``sandrl images templates TASKS --build`` builds each under that name
  (:func:`build_template`); on E2B itself, build a template of that name from the Dockerfile
  (``e2b template build``).

A template the service lacks fails the episode's create with
:class:`~sandrl.errors.ImageNotFoundError` (an infra error that is not retried), naming the
template and these commands.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

from sandrl.errors import ImageBuildError, TaskError
from sandrl.images.dockerfile import only_workdir_over, parse_dockerfile
from sandrl.sandbox.base import ImageSource, prebuilt_image

if TYPE_CHECKING:
    from sandrl.sandbox.bwrap import BwrapProvider

BASE_TEMPLATE = "base"
"""E2B's default template; a sandrl service serves its ``host`` image under this name."""
HOST_IMAGE = "host"
TEMPLATE_PREFIX = "sandrl-"
_DIGEST_CHARS = 20
_CHUNK = 1 << 20


def template_for(source: ImageSource) -> str:
    """The template ``source``'s sandboxes start from on an E2B-compatible service (see the module)."""
    if source.image is not None:
        name = prebuilt_image(source)
        return BASE_TEMPLATE if name == HOST_IMAGE else name
    if source.dockerfile_text is None or _only_host(source):
        return BASE_TEMPLATE
    return TEMPLATE_PREFIX + _digest(source)[:_DIGEST_CHARS]


def _only_host(source: ImageSource) -> bool:
    """The Dockerfile says only ``FROM host`` and ``WORKDIR`` (the spec's workdir): the image is ``host``."""
    assert source.dockerfile_text is not None
    try:
        instructions = parse_dockerfile(source.dockerfile_text, str(source.dockerfile or "Dockerfile"))
    except ImageBuildError as exc:
        raise TaskError(f"{source.label}: its Dockerfile cannot be read: {exc}") from exc
    return only_workdir_over(instructions, HOST_IMAGE)


def _context_dir(source: ImageSource) -> Path | None:
    if source.context_dir is not None:
        return source.context_dir
    return source.dockerfile.parent if source.dockerfile is not None else None


def _digest(source: ImageSource) -> str:
    """sha256 of the Dockerfile's text and of every entry of its build context (path, kind, mode, bytes)."""
    assert source.dockerfile_text is not None
    h = hashlib.sha256(b"sandrl-template-v1\0" + source.dockerfile_text.encode() + b"\0")
    context = _context_dir(source)
    if context is None:
        return h.hexdigest()
    if not context.is_dir():
        raise TaskError(f"{source.label}: its build context {context} is not a directory")
    for root, dirs, files in os.walk(context):
        dirs.sort()
        for name in sorted(files) + [d for d in dirs if (Path(root) / d).is_symlink()]:
            path = Path(root) / name
            rel = path.relative_to(context).as_posix()
            st = path.lstat()
            h.update(f"{rel}\0{st.st_mode:o}\0".encode())
            if path.is_symlink():
                h.update(os.readlink(path).encode() + b"\0")
            elif path.is_file():
                with path.open("rb") as f:
                    while chunk := f.read(_CHUNK):
                        h.update(chunk)
                h.update(b"\0")
    return h.hexdigest()


async def build_template(provider: BwrapProvider, source: ImageSource) -> str:
    """Make the template of ``source`` on this sandrl host: its image, in ``provider``'s store, under
    the name :func:`template_for` gives (a cache hit when built before). Returns the name.

    ``base`` and prebuilt images need no build: ``base`` is always there, a prebuilt image is
    pulled into the store (as the bubblewrap provider does for a task run here)."""
    from sandrl.sandbox.bwrap.dockerfile.builder import ImageBuilder
    from sandrl.sandbox.bwrap.dockerfile.source import build_options, image_for

    name = template_for(source)
    if name == BASE_TEMPLATE:
        return name
    if source.image is not None:
        got = await image_for(provider, source)
        if got != name:
            raise ImageBuildError(
                f"{source.label}: its image {source.image} could not be pulled here (its Dockerfile was built as {got} "
                f"instead); pull it on this host (sandrl images pull {source.image}) so that the template {name} exists"
            )
        return name
    if provider.images.exists(name):
        return name
    try:
        await ImageBuilder(provider).build(
            source.dockerfile,
            context=_context_dir(source),
            text=source.dockerfile_text,
            options=build_options(source),
            tag=name,
        )
    except ImageBuildError as exc:
        raise ImageBuildError(f"{source.label}: building its template {name} failed: {exc}") from exc
    return name
