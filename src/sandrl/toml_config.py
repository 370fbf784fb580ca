"""Reading hand-written TOML config files, with errors a person can act on."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sandrl.errors import ConfigError


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
