"""sandrl.toml_config: one typed reader for the task loaders' tables and the run config's sections."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sandrl.errors import ConfigError, InvalidTaskError
from sandrl.tasks.fields import config_table
from sandrl.toml_config import Table, from_mapping


@dataclass(frozen=True)
class Inner:
    depth: int = 1
    name: str = "x"


@dataclass(frozen=True)
class Section:
    enabled: bool = False
    label: str = ""
    inner: Inner = field(default_factory=Inner)
    items: tuple[Inner, ...] = ()


def test_a_wrong_boolean_or_string_reads_the_same_in_a_task_file_and_a_run_config(tmp_path: Path) -> None:
    """The same mistake gets the same words, with the fix, whichever file it is in."""
    task_file = tmp_path / "task.toml"
    top = config_table({"agent": {"enabled": "yes", "label": 3}}, file=task_file, task=tmp_path).table("agent")
    with pytest.raises(InvalidTaskError) as in_task:
        top.boolean("enabled", False)
    with pytest.raises(ConfigError) as in_config:
        from_mapping(Section, {"enabled": "yes"}, where="[agent]")
    assert in_task.value.message == f"{task_file}: " + in_config.value.message
    assert (
        in_config.value.message
        == "[agent] enabled must be true or false, got 'yes' (a string); write it without quotes"
    )
    assert in_task.value.path == tmp_path

    with pytest.raises(InvalidTaskError) as in_task:
        top.string("label")
    with pytest.raises(ConfigError) as in_config:
        from_mapping(Section, {"label": 3}, where="[agent]")
    assert in_task.value.message == f"{task_file}: " + in_config.value.message
    assert in_config.value.message == "[agent] label must be a string, got 3 (an integer); put it in quotes"


def test_subtables_and_lists_of_tables_are_named_by_their_path() -> None:
    with pytest.raises(ConfigError, match=r"^cfg.toml: \[s.inner\] depth must be an integer, got a string 'deep'$"):
        from_mapping(Section, {"inner": {"depth": "deep"}}, where="cfg.toml: [s]")
    with pytest.raises(ConfigError, match=r"^\[s.items\] must be a table of keys, got an integer$"):
        from_mapping(Section, {"items": [{"depth": 2}, 5]}, where="[s]")
    with pytest.raises(ConfigError, match=r"^\[s.items\]: unknown key\(s\) deep; valid keys are depth, name$"):
        from_mapping(Section, {"items": [{"deep": 2}]}, where="[s]")
    read = from_mapping(Section, {"items": [{"depth": 2}, {"name": "y"}], "inner": {"depth": 3}}, where="[s]")
    assert read == Section(items=(Inner(depth=2), Inner(name="y")), inner=Inner(depth=3))
    nested = Table({"a": {"b": {}}}, section="top").table("a").table("b")
    assert nested.label("k") == "[top.a.b] k" and Table({}).label("k") == "k" and Table({}).label() == "the top level"


def test_unread_keys_are_reported_under_their_dotted_path() -> None:
    table = Table({"known": 1, "typo": 2, "kept": 3}, section="env")
    assert table.integer("known", 0, low=0, high=9) == 1
    assert table.keep(["kept"]) == {"env.kept": 3}
    assert table.unknown() == {"env.typo": 2}
