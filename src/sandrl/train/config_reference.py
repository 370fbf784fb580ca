"""The config reference, written from the config classes themselves: it cannot drift from them.

Every key of a run config is a field of a frozen dataclass with its documentation in the string
under it (an *attribute docstring*). Python drops those strings when it compiles a class, so they
are read back from the class's source with :mod:`ast`; the type and the default come from the
class (:func:`dataclasses.fields`, :func:`typing.get_type_hints`). :func:`render` writes one
Markdown page: ``sandrl config reference`` (:mod:`sandrl.cli.config`) prints it and ``make docs``
writes it to ``docs/guide/config-reference.md``, which a test regenerates and compares.

A field whose type is a config class is a table of its own (``[train.loss]``); a tuple of config
classes is an array of tables (``[[cluster.hosts]]``); a field named in a section's ``flatten`` has
its class's keys written in the section itself (``[cluster]``'s scalar options). A field without a
docstring is an error: :func:`undocumented` names every one, and :func:`render` refuses to write a
page that would leave a key unexplained.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
import types
import typing
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from sandrl.errors import ConfigError
from sandrl.toml_config import toml_key
from sandrl.train.run_config import SECTION_TYPES, dumps


@dataclass(frozen=True)
class Section:
    """One table of a config file and the class it is read into."""

    name: str
    """The table's name as the file writes it: ``train``, ``train.loss``, ``cluster.hosts``."""
    cls: type[Any]
    """The config dataclass its keys are the fields of."""
    flatten: tuple[str, ...] = ()
    """Fields of ``cls`` whose own class's keys sit directly in this table."""
    array: bool = False
    """An array of tables (``[[name]]``), one per item."""
    doc: str = ""
    """What the table is for; empty: the class's docstring."""


def run_sections() -> list[Section]:
    """The tables of ``sandrl train``'s config, in the order the file writes them."""
    return [Section(name, cls) for name, cls in SECTION_TYPES.items()]


def render(sections: Sequence[Section], *, title: str, preface: str = "") -> str:
    """The reference page of ``sections`` and every table nested in them, as Markdown."""
    missing = undocumented(sections)
    if missing:
        raise ConfigError(
            f"{len(missing)} config key(s) have no docstring: {', '.join(missing)}; write what each one does "
            "in a string under its field (the config reference is generated from them)"
        )
    out = [f"# {title}\n"]
    if preface:
        out.append(preface.strip() + "\n")
    index = ", ".join(f"[`{_heading(s)}`](#{_anchor(s)})" for s in _walk(sections))
    out.append(f"Tables: {index}.\n")
    for section in _walk(sections):
        out.append(_render_section(section))
    return "\n".join(out)


def undocumented(sections: Sequence[Section]) -> list[str]:
    """``table.key`` of every field (nested tables included) that has no docstring."""
    return [f"{s.name}.{toml_key(f)}" for s in _walk(sections) for f, _, doc in _keys(s) if not doc.strip()]


def attribute_docstrings(cls: type[Any]) -> dict[str, str]:
    """Each field's docstring (the string under it in the class body), inherited ones included."""
    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):  # a subclass's docstring replaces its base's
        if dataclasses.is_dataclass(klass):
            found.update(_own_docstrings(klass))
    return found


@cache
def _own_docstrings(cls: type[Any]) -> dict[str, str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = next(node for node in tree.body if isinstance(node, ast.ClassDef)).body
    docs: dict[str, str] = {}
    for node, after in zip(body, [*body[1:], None], strict=True):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def _walk(sections: Sequence[Section]) -> Iterator[Section]:
    """Each section, each followed by the tables nested in it (depth first, in field order)."""
    for section in sections:
        yield section
        hints = typing.get_type_hints(section.cls)
        docs = attribute_docstrings(section.cls)
        for f in dataclasses.fields(section.cls):
            if f.name in section.flatten:
                continue
            inner, array = _table_class(hints[f.name])
            if inner is not None:
                name = f"{section.name}.{toml_key(f)}"
                yield from _walk([Section(name, inner, array=array, doc=docs.get(f.name, ""))])


def _keys(section: Section) -> Iterator[tuple[dataclasses.Field[Any], Any, str]]:
    """Each key of the section's own table (nested tables are sections of their own): field, type, docstring."""
    hints = typing.get_type_hints(section.cls)
    docs = attribute_docstrings(section.cls)
    for f in dataclasses.fields(section.cls):
        if f.name in section.flatten:
            yield from _keys(Section(section.name, hints[f.name]))
        elif _table_class(hints[f.name])[0] is None:
            yield f, hints[f.name], docs.get(f.name, "")


def _table_class(hint: Any) -> tuple[type[Any] | None, bool]:
    """The config class a field's type is a table of (an optional one too), and whether it is an array."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return _table_class(args[0])
    if origin is tuple:
        inner, _ = _table_class(typing.get_args(hint)[0])
        return inner, inner is not None
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return hint, False
    return None, False


def _render_section(section: Section) -> str:
    heading = _heading(section)
    lines = [f"## `{heading}`\n"]
    intro = section.doc or inspect.cleandoc(section.cls.__doc__ or "")
    if intro:
        lines.append(_markdown(intro) + "\n")
    hints = typing.get_type_hints(section.cls)
    for f in dataclasses.fields(section.cls):
        inner, _ = _table_class(hints[f.name])
        if inner is not None and f.name not in section.flatten:
            optional = _is_optional(hints[f.name])
            note = " (optional, absent by default)" if optional else ""
            child = Section(f"{section.name}.{toml_key(f)}", inner, array=_table_class(hints[f.name])[1])
            lines.append(f"- [`{_heading(child)}`](#{_anchor(child)}){note}: its own table, below.")
    for f, hint, doc in _keys(section):
        lines.append(f"- **`{toml_key(f)}`** ({_type_text(hint)}, {_default_text(f)})")
        lines.append(textwrap.indent(_markdown(doc), "  "))
    return "\n".join(lines) + "\n"


def _heading(section: Section) -> str:
    return f"[[{section.name}]]" if section.array else f"[{section.name}]"


def _anchor(section: Section) -> str:
    """GitHub's anchor of the section's heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", _heading(section).lower()).replace(" ", "-")


def _is_optional(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint)


def _type_text(hint: Any) -> str:
    """A field's type in a config file's own terms."""
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return "one of " + ", ".join(f"`{_toml(choice)}`" for choice in typing.get_args(hint))
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        text = " or ".join(_type_text(a) for a in args)
        return f"{text}, or `false` for none" if type(None) in typing.get_args(hint) else text
    if origin is tuple:
        item = typing.get_args(hint)[0]
        if typing.get_origin(item) is typing.Literal:
            return "list of " + ", ".join(f"`{_toml(choice)}`" for choice in typing.get_args(item))
        return f"list of {_type_text(item)}s"
    names = {bool: "boolean", int: "integer", float: "number", str: "string"}
    return names.get(hint, getattr(hint, "__name__", str(hint)))


def _default_text(f: dataclasses.Field[Any]) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "required"
    return f"default `{_toml(value)}`"


def _toml(value: object) -> str:
    """``value`` as a config file writes it (None is ``false``: TOML has no null)."""
    return dumps({"v": False if value is None else value}).strip().removeprefix("v = ")


_ROLE = re.compile(r":(?:class|mod|func|meth|attr|data|exc):`~?([^`]+)`")


def _markdown(text: str) -> str:
    """A docstring's reStructuredText as Markdown: ``code`` and :role:`targets` become `code`."""

    def role(match: re.Match[str]) -> str:
        target = match.group(1)
        short = match.group(0).split("`")[1].startswith("~")
        return f"`{target.rsplit('.', 1)[-1] if short else target}`"

    text = _ROLE.sub(role, text)
    text = re.sub(r"(?<!`)``([^`]+)``(?!`)", r"`\1`", text)
    return re.sub(r"(?<!`)(```\w*)", r"`` \1 ``", text)  # a fence named in running text: ```bash
