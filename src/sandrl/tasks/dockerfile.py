"""The two facts a task loader needs from a Dockerfile: the base image and the working directory.

Building the image is :mod:`sandrl.sandbox.bwrap.dockerfile`'s job; reading it is
:mod:`sandrl.images.dockerfile`'s. The loader only takes which image the final stage starts from
(to report it, and to pick an image from the store later) and the last ``WORKDIR`` (the directory
the agent, the tests and the solution run in).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from sandrl.errors import ImageBuildError
from sandrl.images.dockerfile import parse_dockerfile


@dataclass(frozen=True)
class DockerfileFacts:
    base_image: str | None
    """The final stage's ``FROM`` image, aliases of earlier stages followed back."""
    workdir: str | None
    """The final stage's working directory, when it is a plain absolute path."""


def read_dockerfile(text: str) -> DockerfileFacts:
    """The facts of ``text``; none of a Dockerfile that cannot be read (building it says why)."""
    try:
        instructions = parse_dockerfile(text)
    except ImageBuildError:
        return DockerfileFacts(base_image=None, workdir=None)
    stages: dict[str, str] = {}  # alias (lower case) -> the image it starts from
    base: str | None = None
    workdir: str | None = None
    for inst in instructions:
        if inst.keyword == "FROM":
            words = inst.args.split()
            if not words:
                continue
            image = words[0]
            # FROM an earlier stage means the same base as that stage.
            base = stages.get(image.lower(), image)
            if len(words) >= 3 and words[1].lower() == "as":
                stages[words[2].lower()] = base
            workdir = None  # each stage starts afresh
        elif inst.keyword == "WORKDIR" and inst.args:
            path = inst.args.strip("\"'")
            if "$" in path:
                workdir = None  # depends on ARG/ENV values this reader does not evaluate
            elif path.startswith("/"):
                workdir = posixpath.normpath(path)
            elif workdir is not None:
                workdir = posixpath.normpath(posixpath.join(workdir, path))
    return DockerfileFacts(base_image=base, workdir=workdir)
