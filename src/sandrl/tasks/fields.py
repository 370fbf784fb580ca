"""What the task loaders share: reading a task's files, warning about one, and its config tables.

Task files are written by hand, so a wrong type is common and must be reported as
``task.toml: [agent] timeout_sec must be a number of seconds > 0, got 'ten' (a string)`` rather
than as a traceback. The loaders read every key through a :func:`config_table`, sandrl's one typed
reader (:class:`sandrl.toml_config.Table`) raising :class:`~sandrl.errors.InvalidTaskError`, which
also remembers which keys were read so that the rest can be reported as unknown.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from sandrl.errors import InvalidTaskError
from sandrl.images.dockerfile import MAX_DOCKERFILE_CHARS
from sandrl.toml_config import Table

MAX_TASK_FILE_CHARS = MAX_DOCKERFILE_CHARS
"""The most of one of a task's files (its config, instruction, Dockerfile) that sandrl reads: a task
directory is hostile input, and a multi-GB file in it must not be read whole into memory. The
Dockerfile parser's own bound, so that every Dockerfile it would take can be read."""


class TaskWarning(UserWarning):
    """A task loaded, but something in it is ignored or cannot be honoured here."""


def read_text(file: Path, task_dir: Path) -> str:
    """The text of one of a task's files; :class:`InvalidTaskError` naming it when it cannot be read
    or is longer than :data:`MAX_TASK_FILE_CHARS` (of which at most one character more is read)."""
    try:
        with file.open(encoding="utf-8") as f:
            text = f.read(MAX_TASK_FILE_CHARS + 1)
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidTaskError(f"{file}: cannot be read ({exc})", path=task_dir) from exc
    if len(text) > MAX_TASK_FILE_CHARS:
        raise InvalidTaskError(
            f"{file}: is more than {MAX_TASK_FILE_CHARS} characters long, more than sandrl reads of a task's file; "
            "a task's files are its recipe and its prompt: move data into files that its Dockerfile COPYs "
            "or its tests read",
            path=task_dir,
        )
    return text


def warn(file: Path | None, message: str) -> None:
    """Warn about one task file (a :class:`~sandrl.toml_config.Table`'s ``file``); the warning points at the
    caller of the loader."""
    warnings.warn(f"{file}: {message}" if file is not None else message, TaskWarning, stacklevel=4)


def config_table(data: object, *, file: Path, task: Path, section: str | None = None) -> Table:
    """A table of the task ``task``'s config ``file`` (``section``; None: its top level); a bad key is an
    :class:`InvalidTaskError` naming the file and the task."""
    return Table(data, file=file, section=section, error=lambda message: InvalidTaskError(message, path=task))
