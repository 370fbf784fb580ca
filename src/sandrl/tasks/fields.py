"""Typed reading of one table of a task config file, with errors that name the file, key and fix.

Task files are written by hand, so a wrong type is common and must be reported as
``task.toml: [agent] timeout_sec must be a number of seconds > 0, got "ten" (a string)`` rather
than as a traceback. The loaders read every key through a :class:`Table`, which also remembers
which keys were read so that the rest can be reported as unknown.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path

from sandrl.errors import InvalidTaskError
from sandrl.toml_config import type_name as type_name

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class TaskWarning(UserWarning):
    """A task loaded, but something in it is ignored or cannot be honoured here."""


def read_text(file: Path, task_dir: Path) -> str:
    """The text of one of a task's files; :class:`InvalidTaskError` naming it when it cannot be read."""
    try:
        return file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidTaskError(f"{file}: cannot be read ({exc})", path=task_dir) from exc


def warn(file: Path, message: str) -> None:
    """Warn about one task file; the warning points at the caller of the loader."""
    warnings.warn(f"{file}: {message}", TaskWarning, stacklevel=4)


class Table:
    """One table (``[agent]``, the top level of ``task.yaml``...) of a task config file."""

    def __init__(self, data: object, *, file: Path, section: str | None = None, task: Path | None = None) -> None:
        self.file = file
        self.section = section
        self.task = task if task is not None else file.parent
        if not isinstance(data, Mapping):
            raise self.error(f"{self._where()} must be a table of keys, got {type_name(data)}", fix=None)
        self.data: Mapping[str, object] = data
        self._read: set[str] = set()

    def _where(self, key: str | None = None) -> str:
        prefix = f"[{self.section}]" if self.section else "the top level"
        if key is None:
            return prefix
        return f"[{self.section}] {key}" if self.section else key

    def error(self, message: str, *, fix: str | None) -> InvalidTaskError:
        text = f"{self.file}: {message}"
        if fix:
            text += f"; {fix}"
        return InvalidTaskError(text, path=self.task)

    def has(self, key: str) -> bool:
        return key in self.data

    def raw(self, key: str) -> object:
        self._read.add(key)
        return self.data.get(key)

    def seconds(self, key: str, default: float) -> float:
        value = self.raw(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
            raise self.error(
                f"{self._where(key)} must be a number of seconds > 0, got {value!r} ({type_name(value)})",
                fix=f"write e.g. {key} = 600.0",
            )
        return float(value)

    def number(self, key: str, default: float, *, low: float, high: float) -> float:
        value = self.raw(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
            raise self.error(
                f"{self._where(key)} must be a number between {low:g} and {high:g}, got {value!r} ({type_name(value)})",
                fix=None,
            )
        return float(value)

    def integer(self, key: str, default: int, *, low: int, high: int) -> int:
        value = self.raw(key)
        if value is None:
            return default
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self.error(
                f"{self._where(key)} must be a whole number between {low} and {high}, "
                f"got {value!r} ({type_name(value)})",
                fix=None,
            )
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.raw(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(
                f"{self._where(key)} must be true or false, got {value!r} ({type_name(value)})",
                fix="write it without quotes",
            )
        return value

    def string(self, key: str, default: str | None = None, *, required: bool = False) -> str | None:
        value = self.raw(key)
        if value is None:
            if required:
                raise self.error(f"{self._where(key)} is missing", fix=f"add {key} (a string)")
            return default
        if not isinstance(value, str):
            raise self.error(
                f"{self._where(key)} must be a string, got {value!r} ({type_name(value)})", fix="put it in quotes"
            )
        return value

    def strings(self, key: str) -> list[str]:
        value = self.raw(key)
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise self.error(
                f"{self._where(key)} must be a list of strings, got {value!r}", fix='write e.g. ["a", "b"]'
            )
        return list(value)

    def env(self, key: str) -> dict[str, str]:
        value = self.raw(key)
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise self.error(
                f'{self._where(key)} must be a table of NAME = "value", got {type_name(value)}',
                fix=f'write e.g. {key} = {{ NAME = "value" }}',
            )
        out: dict[str, str] = {}
        for name, item in value.items():
            if not isinstance(name, str) or not _ENV_NAME.match(name):
                raise self.error(
                    f"{self._where(key)}: {name!r} is not a valid environment variable name",
                    fix="use letters, digits and '_', not starting with a digit",
                )
            if not isinstance(item, str) or "\0" in item:
                raise self.error(
                    f"{self._where(key)}: the value of {name} must be a string, got {item!r} ({type_name(item)})",
                    fix="put it in quotes",
                )
            out[name] = item
        return out

    def table(self, key: str) -> Table:
        value = self.raw(key)
        section = f"{self.section}.{key}" if self.section else key
        return Table({} if value is None else value, file=self.file, section=section, task=self.task)

    def keep(self, keys: Iterable[str]) -> dict[str, object]:
        """Keys the format defines that the loader does not act on, read (so not unknown) and
        returned under their dotted path, for :attr:`~sandrl.tasks.task.Task.extra`."""
        prefix = f"{self.section}." if self.section else ""
        kept: dict[str, object] = {}
        for key in keys:
            if key in self.data and key not in self._read:
                kept[f"{prefix}{key}"] = self.raw(key)
        return kept

    def unknown(self, extra_known: Iterable[str] = ()) -> dict[str, object]:
        """Keys never read (nor in ``extra_known``), under their dotted path."""
        known = self._read | set(extra_known)
        prefix = f"{self.section}." if self.section else ""
        return {f"{prefix}{key}": value for key, value in self.data.items() if key not in known}
