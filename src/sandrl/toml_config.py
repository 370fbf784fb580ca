"""Reading hand-written config files (TOML, and a task's YAML) with errors a person can act on.

One reader for every typed table sandrl reads:

- :class:`Table` reads one table key by key (``table.seconds("timeout_sec", 600.0)``), remembering
  which keys were read so that the rest can be reported as unknown: the task loaders
  (:mod:`sandrl.tasks.harbor`, :mod:`sandrl.tasks.terminal_bench`), whose files carry keys sandrl
  keeps or warns about.
- :func:`from_mapping` reads a whole table into a config dataclass through a :class:`Table`, each
  key checked against its field's type, an unknown key refused: a run's sections
  (:mod:`sandrl.train.run_config`), ``[cluster]`` (:mod:`sandrl.cluster.config`).

Errors name the file, the table and the key, what was found and how to fix it:
``task.toml: [agent] timeout_sec must be a number of seconds > 0, got 'ten' (a string); write e.g.
timeout_sec = 600.0``, ``config.toml: [train] lr must be a number, got a string 'fast'``.

TOML has no null, so an optional setting is switched off with ``false``. A dataclass field whose key
cannot be its Python name (``is``, a keyword) says its key in its metadata,
``field(metadata={"toml": "is"})``; :func:`toml_key` reads it for every reader and writer.
"""

from __future__ import annotations

import dataclasses
import math
import re
import tomllib
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from sandrl.errors import ConfigError, SandrlError

T = TypeVar("T")

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def type_name(value: object) -> str:
    """How a value's type is called in a config file's own terms ("a string", "a table"...)."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, Mapping):
        return "a table"
    return "null" if value is None else type(value).__name__


def read_toml(file: Path) -> dict[str, Any]:
    """The parsed file; a missing file or bad TOML is a :class:`ConfigError` naming the file."""
    try:
        return tomllib.loads(file.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read the config file {file}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file} is not valid TOML: {exc}") from exc


class Table:
    """One table (``[agent]``, a file's top level, ``[train.loss]``...) of a config file, read key by key.

    ``file`` prefixes every message; ``section`` names the table (``agent.env``: ``[agent.env]``; None:
    the top level, whose keys are named bare). ``where`` names it instead where the name is not a
    section (``config.toml: [train]``, ``[cluster.hosts] #2``). ``error`` makes the exception a message
    becomes (a task loader's :class:`~sandrl.errors.InvalidTaskError` naming the task).
    """

    def __init__(
        self,
        data: object,
        *,
        file: Path | None = None,
        section: str | None = None,
        where: str | None = None,
        error: Callable[[str], SandrlError] = ConfigError,
    ) -> None:
        self.file = file
        self.section = section
        self.where = where
        self._error = error
        if not isinstance(data, Mapping):
            raise self.error(f"{self.label()} must be a table of keys, got {type_name(data)}", fix=None)
        self.data: Mapping[str, object] = data
        self._read: set[str] = set()

    def label(self, key: str | None = None) -> str:
        """How a message names this table (no ``key``) or one of its keys."""
        name = self.where if self.where is not None else f"[{self.section}]" if self.section else None
        if key is None:
            return name or "the top level"
        return f"{name} {key}" if name else key

    def error(self, message: str, *, fix: str | None) -> SandrlError:
        """The error of ``message`` about this table, with the file's name before it and the fix after."""
        text = f"{self.file}: {message}" if self.file is not None else message
        return self._error(f"{text}; {fix}" if fix else text)

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
                f"{self.label(key)} must be a number of seconds > 0, got {value!r} ({type_name(value)})",
                fix=f"write e.g. {key} = 600.0",
            )
        return float(value)

    def number(self, key: str, default: float, *, low: float, high: float) -> float:
        value = self.raw(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
            raise self.error(
                f"{self.label(key)} must be a number between {low:g} and {high:g}, got {value!r} ({type_name(value)})",
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
                f"{self.label(key)} must be a whole number between {low} and {high}, "
                f"got {value!r} ({type_name(value)})",
                fix=None,
            )
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.raw(key)
        return default if value is None else self._boolean(value, self.label(key))

    def _boolean(self, value: object, label: str) -> bool:
        if not isinstance(value, bool):
            raise self.error(
                f"{label} must be true or false, got {value!r} ({type_name(value)})", fix="write it without quotes"
            )
        return value

    def string(self, key: str, default: str | None = None, *, required: bool = False) -> str | None:
        value = self.raw(key)
        if value is None:
            if required:
                raise self.error(f"{self.label(key)} is missing", fix=f"add {key} (a string)")
            return default
        return self._string(value, self.label(key))

    def _string(self, value: object, label: str) -> str:
        if not isinstance(value, str):
            raise self.error(f"{label} must be a string, got {value!r} ({type_name(value)})", fix="put it in quotes")
        return value

    def strings(self, key: str) -> list[str]:
        value = self.raw(key)
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise self.error(f"{self.label(key)} must be a list of strings, got {value!r}", fix='write e.g. ["a", "b"]')
        return list(value)

    def env(self, key: str) -> dict[str, str]:
        value = self.raw(key)
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise self.error(
                f'{self.label(key)} must be a table of NAME = "value", got {type_name(value)}',
                fix=f'write e.g. {key} = {{ NAME = "value" }}',
            )
        out: dict[str, str] = {}
        for name, item in value.items():
            if not isinstance(name, str) or not _ENV_NAME.match(name):
                raise self.error(
                    f"{self.label(key)}: {name!r} is not a valid environment variable name",
                    fix="use letters, digits and '_', not starting with a digit",
                )
            if not isinstance(item, str) or "\0" in item:
                raise self.error(
                    f"{self.label(key)}: the value of {name} must be a string, got {item!r} ({type_name(item)})",
                    fix="put it in quotes",
                )
            out[name] = item
        return out

    def table(self, key: str) -> Table:
        """The subtable ``key`` (empty if absent), named as this one's child."""
        value = self.raw(key)
        return self.child(key, {} if value is None else value)

    def child(self, key: str, data: object) -> Table:
        """``data`` as the table ``key`` under this one (or one of the list of tables ``key``)."""
        if self.where is not None:
            where = f"{self.where[:-1]}.{key}]" if self.where.endswith("]") else f"{self.where}: [{key}]"
            return Table(data, file=self.file, where=where, error=self._error)
        section = f"{self.section}.{key}" if self.section else key
        return Table(data, file=self.file, section=section, error=self._error)

    def keep(self, keys: Iterable[str]) -> dict[str, object]:
        """Keys the format defines that the loader does not act on, read (so not unknown) and
        returned under their dotted path, for :attr:`~sandrl.tasks.task.Task.extra`."""
        kept: dict[str, object] = {}
        for key in keys:
            if key in self.data and key not in self._read:
                kept[f"{self._prefix()}{key}"] = self.raw(key)
        return kept

    def unknown(self, extra_known: Iterable[str] = ()) -> dict[str, object]:
        """Keys never read (nor in ``extra_known``), under their dotted path."""
        known = self._read | set(extra_known)
        return {f"{self._prefix()}{key}": value for key, value in self.data.items() if key not in known}

    def _prefix(self) -> str:
        return f"{self.section}." if self.section else ""


def from_mapping(cls: type[T], table: object, *, where: str) -> T:
    """An instance of the config dataclass ``cls`` from ``table``, type-checked key by key; ``where``
    names the table in messages (``config.toml: [train]``). A check of the dataclass's own is
    reported after ``where:``."""
    return _read_dataclass(cls, Table(table, where=where))


def _read_dataclass(cls: type[T], table: Table) -> T:
    hints = typing.get_type_hints(cls)
    fields = {toml_key(f): f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(str(k) for k in table.data if k not in fields)
    if unknown:
        raise table.error(
            f"{table.label()}: unknown key(s) {', '.join(unknown)}; valid keys are {', '.join(fields)}", fix=None
        )
    values: dict[str, Any] = {}
    for key in table.data:
        name = fields[key].name
        values[name] = _convert(table, key, hints[name], table.raw(key), table.label(key))
    try:
        return cls(**values)
    except ConfigError as exc:
        raise table.error(f"{table.label()}: {exc.message}", fix=None) from exc


def _convert(table: Table, key: str, hint: Any, raw: object, label: str) -> Any:
    """``raw``, the value of ``key`` (or an item of it, named ``label``), as a value of ``hint``."""
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return _read_dataclass(hint, table.child(key, raw))
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        choices = typing.get_args(hint)
        if raw not in choices:
            raise table.error(f"{label} must be one of {', '.join(map(repr, choices))}, got {raw!r}", fix=None)
        return raw
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if raw is False or raw is None:  # TOML has no null: `false` switches an optional setting off
            return None
        if len(args) == 1:
            return _convert(table, key, args[0], raw, label)
    if hint is bool:
        return table._boolean(raw, label)
    if hint is int:
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise table.error(f"{label} must be an integer, got {type_name(raw)} {raw!r}", fix=None)
        return raw
    if hint is float:
        if isinstance(raw, bool) or not isinstance(raw, int | float):
            raise table.error(f"{label} must be a number, got {type_name(raw)} {raw!r}", fix=None)
        return float(raw)
    if hint is str:
        return table._string(raw, label)
    if origin is tuple:
        item = typing.get_args(hint)[0]
        if not isinstance(raw, list | tuple):
            raise table.error(f'{label} must be a list, e.g. ["a", "b"], got {type_name(raw)} {raw!r}', fix=None)
        return tuple(_convert(table, key, item, x, f"{label}[{i}]") for i, x in enumerate(raw))
    raise table.error(f"{label}: values of type {hint} cannot be read from a config file", fix=None)  # pragma: no cover


def toml_key(f: dataclasses.Field[Any]) -> str:
    """The key a config file writes for the field ``f``: its ``"toml"`` metadata, else its name."""
    return str(f.metadata.get("toml", f.name))


def to_table(config: object) -> dict[str, Any]:
    """The config dataclass ``config`` as a TOML-ready dict keyed as a file writes it (None as ``false``)."""
    return none_as_false({toml_key(f): _plain(getattr(config, f.name)) for f in dataclasses.fields(config)})  # type: ignore[arg-type]


def _plain(value: object) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_table(value)
    if isinstance(value, tuple | list):
        return type(value)(_plain(v) for v in value)
    return value


def none_as_false(data: dict[str, Any]) -> dict[str, Any]:
    """TOML has no null: an optional setting that is off is written ``false`` (:func:`from_mapping`: None)."""
    return {k: none_as_false(v) if isinstance(v, dict) else (False if v is None else v) for k, v in data.items()}
