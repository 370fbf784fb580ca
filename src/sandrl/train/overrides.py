"""``--set section.key=value``: a run config's settings changed from the command line.

::

    sandrl train configs/tiny.toml --set run.steps=40 --set train.lr=3e-5 --set train.loss.loss_type=grpo

The key is looked up in the config classes (:mod:`sandrl.train.run_config`), so an unknown one
is refused the way an unknown key in the file is, with the valid keys; the value is read as
that key's type (``40`` an integer, ``3e-5`` a number, ``true``/``false`` a boolean, anything
for a string, ``false`` switches an optional setting off). The overridden table is then checked
with the rest of the file, so a value the file could not hold is refused the same way.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from sandrl.errors import ConfigError
from sandrl.toml_config import toml_key


def apply_overrides(
    data: Mapping[str, object], overrides: Sequence[str], sections: Mapping[str, type[Any]]
) -> dict[str, Any]:
    """``data`` (parsed TOML) with each ``section.key=value`` put in, the value typed by ``sections``' classes."""
    out: dict[str, Any] = dict(data)
    for item in overrides:
        path, value = _parse(item, sections)
        _put(out, path, value)
    return out


def _parse(item: str, sections: Mapping[str, type[Any]]) -> tuple[list[str], object]:
    dotted, sep, text = item.partition("=")
    path = dotted.strip().split(".")
    if not sep or len(path) < 2 or not all(path):
        raise ConfigError(f"--set takes section.key=value (e.g. run.steps=40), got {item!r}")
    if path[0] not in sections:
        raise ConfigError(f"--set {item}: unknown section {path[0]}; valid sections are {', '.join(sections)}")
    hint: Any = sections[path[0]]
    for depth, key in enumerate(path[1:], start=1):
        table = ".".join(path[:depth])
        if not _is_table(hint):
            raise ConfigError(f"--set {item}: {table} is a setting, not a table")
        fields = {toml_key(f): f.name for f in dataclasses.fields(hint)}
        if key not in fields:
            raise ConfigError(f"--set {item}: [{table}]: unknown key {key}; valid keys are {', '.join(fields)}")
        hint = _optional_table(typing.get_type_hints(hint)[fields[key]])
        if depth == len(path) - 1 and _is_table(hint) and text.strip() == "false":
            return path, False  # an optional table switched off (`--set train.lora=false`)
    if _is_table(hint):
        keys = ", ".join(toml_key(f) for f in dataclasses.fields(hint))
        raise ConfigError(f"--set {item}: [{dotted}] is a table: set one of its keys ({keys})")
    return path, _typed(hint, text.strip(), f"--set {item}: {dotted}")


def _optional_table(hint: Any) -> Any:
    """``Table | None`` (an optional table, such as ``[train.lora]``) as its table; any other hint as it is."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1 and _is_table(args[0]):
            return args[0]
    return hint


def _is_table(hint: Any) -> bool:
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


def _typed(hint: Any, text: str, label: str) -> object:
    """``text`` as a value of ``hint``; the config's own check (:func:`~sandrl.toml_config.from_mapping`) follows."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        if text in ("false", "none", "None"):
            return False  # TOML has no null: `false` switches an optional setting off
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return _typed(args[0], text, label) if len(args) == 1 else text
    if hint is bool:
        if text not in ("true", "false"):
            raise ConfigError(f"{label} must be true or false, got {text!r}")
        return text == "true"
    if hint is int:
        try:
            return int(text.replace("_", ""))
        except ValueError:
            raise ConfigError(f"{label} must be an integer, got {text!r}") from None
    if hint is float:
        try:
            return float(text.replace("_", ""))
        except ValueError:
            raise ConfigError(f"{label} must be a number, got {text!r}") from None
    if typing.get_origin(hint) is tuple:  # a list: comma-separated, each item typed
        item = typing.get_args(hint)[0]
        return [_typed(item, part.strip(), label) for part in text.split(",") if part.strip()]
    return text  # a string, or a choice (Literal) that the config's check names the options of


def _put(data: dict[str, Any], path: list[str], value: object) -> None:
    table = data
    for key in path[:-1]:
        inner = table.get(key)
        if inner is None:
            inner = {}
        elif isinstance(inner, Mapping):
            inner = dict(inner)
        else:
            return  # not a table in the file: its own check names it
        table[key] = inner
        table = inner
    table[path[-1]] = value
