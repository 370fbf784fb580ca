"""The two facts a task loader needs from a Dockerfile: the base image and the working directory.

Building the image is :mod:`sandrl.sandbox.bwrap.dockerfile`'s job. The loader only reads which
image the final stage starts from (to report it, and to pick an image from the store later) and
the last ``WORKDIR`` (the directory the agent, the tests and the solution run in).
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

_INSTRUCTION = re.compile(r"^\s*([A-Za-z]+)\s+(.*)$", re.DOTALL)


@dataclass(frozen=True)
class DockerfileFacts:
    base_image: str | None
    """The final stage's ``FROM`` image, aliases of earlier stages followed back."""
    workdir: str | None
    """The final stage's working directory, when it is a plain absolute path."""


def _logical_lines(text: str) -> list[str]:
    """Instructions with ``\\`` continuations joined and comments dropped."""
    lines: list[str] = []
    current = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue  # a comment inside a continued instruction is dropped by Docker too
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append(current + stripped)
        current = ""
    if current.strip():
        lines.append(current)
    return lines


def read_dockerfile(text: str) -> DockerfileFacts:
    stages: dict[str, str] = {}  # alias (lower case) -> the image it starts from
    base: str | None = None
    workdir: str | None = None
    for line in _logical_lines(text):
        match = _INSTRUCTION.match(line)
        if not match:
            continue
        instruction, args = match.group(1).upper(), match.group(2).strip()
        if instruction == "FROM":
            words = [word for word in args.split() if not word.startswith("--")]
            if not words:
                continue
            image = words[0]
            # FROM an earlier stage means the same base as that stage.
            base = stages.get(image.lower(), image)
            if len(words) >= 3 and words[1].lower() == "as":
                stages[words[2].lower()] = base
            workdir = None  # each stage starts afresh
        elif instruction == "WORKDIR" and args:
            path = args.strip("\"'")
            if "$" in path:
                workdir = None  # depends on ARG/ENV values this reader does not evaluate
            elif path.startswith("/"):
                workdir = posixpath.normpath(path)
            elif workdir is not None:
                workdir = posixpath.normpath(posixpath.join(workdir, path))
    return DockerfileFacts(base_image=base, workdir=workdir)
