"""The names the builder gives images in the store: its cache's, and each task's finished image."""

from __future__ import annotations

import re

BUILD_PREFIX = "build-"
"""Images the builder registers for its cache: ``build-<key>``."""
TASK_PREFIX = "task-"
"""The finished images of tasks' Dockerfiles: ``task-<task id>-<key>``."""
TASK_KEY_CHARS = 16
_NAME_CHARS = 128
"""The longest image name the store takes (:meth:`~sandrl.sandbox.bwrap.images.ImageStore.check_name`)."""


def image_name_for(key: str) -> str:
    """The cache image of build key ``key``."""
    return f"{BUILD_PREFIX}{key[:24]}"


def task_image_name(task: str, key: str) -> str:
    """The name of task ``task``'s image of build key ``key``: its id lower-cased, every run of
    characters a store name cannot hold (``/``, spaces...) made one ``-``, cut to fit."""
    slug = re.sub(r"[^a-z0-9._-]+", "-", task.lower()).strip("-._")
    room = _NAME_CHARS - len(TASK_PREFIX) - 1 - TASK_KEY_CHARS
    slug = slug[:room].rstrip("-._") or "unnamed"
    return f"{TASK_PREFIX}{slug}-{key[:TASK_KEY_CHARS]}"
