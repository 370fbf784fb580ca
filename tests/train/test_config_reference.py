"""The config reference is the config classes: regenerated, it is the committed page, and no key is unexplained."""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest
from typer.testing import CliRunner

from sandrl.cli import app
from sandrl.cli.config import reference_sections, reference_text
from sandrl.errors import ConfigError
from sandrl.toml_config import from_mapping, to_table, toml_key
from sandrl.train.config_reference import Section, attribute_docstrings, render, undocumented
from sandrl.train.overrides import apply_overrides

PAGE = Path(__file__).resolve().parents[2] / "docs" / "guide" / "config-reference.md"


def test_the_committed_reference_is_what_the_config_classes_say() -> None:
    assert PAGE.is_file(), f"{PAGE} is missing: run `make docs`"
    assert PAGE.read_text() == reference_text(), f"{PAGE} differs from the config classes: run `make docs`"


def test_every_key_of_a_run_config_has_a_docstring() -> None:
    assert undocumented(reference_sections()) == []


def test_the_page_names_every_key_the_loader_accepts() -> None:
    """Walked apart from the renderer: every table and key a config file may hold is on the page."""
    page = reference_text()
    expected: set[str] = set()

    def walk(table: str, cls: type[Any], flatten: tuple[str, ...] = ()) -> None:
        expected.add(table)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            hint = hints[f.name]
            inner = [a for a in (*typing.get_args(hint), hint) if dataclasses.is_dataclass(a) and isinstance(a, type)]
            if f.name in flatten:
                expected.update(f"{table}.{toml_key(g)}" for g in dataclasses.fields(hint))
            elif inner:
                walk(f"{table}.{toml_key(f)}", inner[0])
            else:
                expected.add(f"{table}.{toml_key(f)}")

    for section in reference_sections():
        walk(section.name, section.cls, section.flatten)
    found: set[str] = set()
    table = ""
    for line in page.splitlines():
        if heading := re.fullmatch(r"## `\[\[?([\w.]+)\]\]?`", line):
            table = heading.group(1)
            found.add(table)
        elif key := re.match(r"- \*\*`(\w+)`\*\* \(", line):
            found.add(f"{table}.{key.group(1)}")
    assert found == expected
    needed_keys = ("train.processes", "train.dtype", "train.lora.rank", "train.loss.loss_type", "train.loss.is.band")
    for needed in (*needed_keys, "cluster.hosts.url"):
        assert needed in found


def test_sandrl_config_reference_prints_or_writes_the_page(tmp_path: Path) -> None:
    out = tmp_path / "guide" / "ref.md"
    written = CliRunner().invoke(app, ["config", "reference", "-o", str(out)])
    assert written.exit_code == 0, written.output
    assert out.read_text() == reference_text()
    printed = CliRunner().invoke(app, ["config", "reference"])
    assert printed.exit_code == 0, printed.output
    assert printed.stdout == reference_text()


# -- the walker on classes of its own ----------------------------------------------------------------------


@dataclass(frozen=True)
class Inner:
    """A nested table."""

    depth: int = 2
    """How deep it goes."""


@dataclass(frozen=True)
class Item:
    """One of many."""

    url: str
    """Where it is."""


@dataclass(frozen=True)
class Base:
    """The base."""

    a: int = 1
    """The base's a."""
    b: str = "x"
    """The base's b."""

    def helper(self) -> int:
        return self.a

    c: float | None = None
    """After a method: still a field with its docstring."""


@dataclass(frozen=True)
class Child(Base):
    """The child."""

    b: str = "y"
    """The child's own b."""
    kind: Literal["one", "two"] = "one"
    """A choice."""
    inner: Inner = field(default_factory=Inner)
    """``[demo.inner]``: nested."""
    extra: Inner | None = None
    """An optional table."""
    items: tuple[Item, ...] = ()
    """An array of tables."""
    names: tuple[str, ...] = ("p", "q")
    """A list."""


@dataclass(frozen=True)
class Undocumented:
    """Two keys, one of them bare."""

    said: int = 1
    """Documented."""
    unsaid: int = 2


def test_docstrings_are_read_from_the_source_inherited_overridden_and_after_methods() -> None:
    docs = attribute_docstrings(Child)
    assert docs["a"] == "The base's a."
    assert docs["b"] == "The child's own b."
    assert docs["c"] == "After a method: still a field with its docstring."
    assert docs["kind"] == "A choice."


def test_types_defaults_and_nested_tables_are_written_as_a_config_file_holds_them() -> None:
    page = render([Section("demo", Child)], title="T")
    assert "- **`a`** (integer, default `1`)\n  The base's a." in page
    assert '- **`b`** (string, default `"y"`)\n  The child\'s own b.' in page
    assert "- **`c`** (number, or `false` for none, default `false`)" in page
    assert '- **`kind`** (one of `"one"`, `"two"`, default `"one"`)' in page
    assert '- **`names`** (list of strings, default `["p", "q"]`)' in page
    assert "## `[demo.inner]`\n\n`[demo.inner]`: nested." in page
    assert "## `[demo.extra]`\n\nAn optional table." in page
    assert "[`[demo.extra]`](#demoextra) (optional, absent by default)" in page
    assert "## `[[demo.items]]`" in page
    assert "- **`url`** (string, required)" in page
    assert "- **`depth`** (integer, default `2`)" in page


def test_a_key_without_a_docstring_is_refused_by_name() -> None:
    assert undocumented([Section("demo", Undocumented)]) == ["demo.unsaid"]
    with pytest.raises(ConfigError, match=r"demo\.unsaid"):
        render([Section("demo", Undocumented)], title="T")


def test_flattened_fields_are_keys_of_the_table_itself() -> None:
    @dataclass(frozen=True)
    class Holder:
        """Holds options."""

        options: Inner = field(default_factory=Inner)
        name: str = ""
        """A name."""

    page = render([Section("h", Holder, flatten=("options",))], title="T")
    assert "- **`depth`** (integer, default `2`)" in page
    assert "[h.options]" not in page


@dataclass(frozen=True)
class Keyword:
    """A table whose keys include a Python keyword."""

    is_: Inner | None = field(default=None, metadata={"toml": "is"})
    """``[k.is]``: a table named by a keyword."""
    from_: int = field(default=0, metadata={"toml": "from"})
    """A key named by a keyword."""


def test_a_key_that_is_a_python_keyword_is_read_written_and_documented_as_the_file_spells_it() -> None:
    config = from_mapping(Keyword, {"from": 3, "is": {"depth": 5}}, where="[k]")
    assert config == Keyword(is_=Inner(depth=5), from_=3)
    assert to_table(config) == {"is": {"depth": 5}, "from": 3}
    with pytest.raises(ConfigError, match=r"\[k\]: unknown key\(s\) from_; valid keys are is, from"):
        from_mapping(Keyword, {"from_": 3}, where="[k]")
    with pytest.raises(ConfigError, match=r"\[k.is\] depth must be an integer"):
        from_mapping(Keyword, {"is": {"depth": "deep"}}, where="[k]")
    page = render([Section("k", Keyword)], title="T")
    assert "## `[k.is]`" in page and "- **`from`** (integer, default `0`)" in page
    assert "is_" not in page and "from_" not in page
    assert apply_overrides({}, ["k.is.depth=4", "k.from=1"], {"k": Keyword}) == {"k": {"is": {"depth": 4}, "from": 1}}
