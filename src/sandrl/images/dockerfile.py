"""Dockerfiles, read as Docker reads them: the one parser every reader of a Dockerfile uses.

:func:`parse_dockerfile` turns a Dockerfile into :class:`Instruction` s, one per logical line:
parser directives (``# escape=``), comments, line continuations, ``--flag=value`` options, the
JSON-array ("exec") and shell forms, and the bodies of heredocs (``RUN <<EOF``). :func:`words`
splits an argument string into words the way Docker does, with quotes, escapes and ``$VAR`` /
``${VAR}`` / ``${VAR:-default}`` / ``${VAR:+alternative}`` substitution.

What an instruction means is each reader's business: the bubblewrap builder
(:mod:`sandrl.sandbox.bwrap.dockerfile`) runs it, the task loader (:mod:`sandrl.tasks.dockerfile`)
takes the base image and working directory from it, E2B's template naming asks whether it changes
anything, the Harbor integration applies it in a sandbox. Here every instruction is read, and a
malformed one raises :class:`~sandrl.errors.ImageBuildError` naming the file and the line.

A task's Dockerfile is hostile input: its size is bounded (:data:`MAX_DOCKERFILE_CHARS`) and
a JSON form nested thousands deep is the shell form, so reading one costs the reader bounded time
and memory and never a traceback.

This module imports nothing of sandrl but its errors (the Harbor integration installs it in
Harbor's own Python without sandrl's dependencies).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sandrl.errors import ImageBuildError

MAX_DOCKERFILE_CHARS = 1 << 20
"""The longest Dockerfile read (1 Mi characters; real ones are a few KiB)."""
HEREDOC_KEYWORDS = frozenset({"RUN", "COPY", "ADD"})
"""The instructions whose arguments may open heredocs (as BuildKit reads them)."""

_DIRECTIVE = re.compile(r"^#\s*([a-zA-Z][a-zA-Z0-9]*)\s*=\s*(.+?)\s*$")
_KEYWORD = re.compile(r"^([A-Za-z]+)(\s+(.*))?$", re.DOTALL)
_FLAG = re.compile(r"^--([a-z][a-z0-9-]*)(?:=(.*))?$", re.DOTALL)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HEREDOC = re.compile(r"^<<(-?)(['\"]?)([A-Za-z0-9_.-]+)\2$")


@dataclass(frozen=True)
class Heredoc:
    """A here-document an instruction opens (``<<EOF`` ... ``EOF``)."""

    name: str
    """Its terminator, ``EOF`` in ``<<EOF``."""
    body: str
    """The lines between the instruction and the terminator, each ending in a newline."""
    expand: bool
    """False when the terminator is quoted (``<<'EOF'``): no substitution in the body."""


@dataclass(frozen=True)
class Instruction:
    """One instruction of a Dockerfile."""

    keyword: str
    """Upper case: ``RUN``, ``COPY``..."""
    args: str
    """Everything after the keyword and its ``--flags``, continuations joined."""
    line: int
    """The line it starts on (1-based)."""
    source: str
    """The file, for messages."""
    flags: Mapping[str, str] = field(default_factory=dict)
    """``--name=value`` options before the arguments (``--name`` alone is ``"true"``)."""
    exec_form: tuple[str, ...] | None = None
    """The arguments when written as a JSON array of strings (``RUN ["a", "b"]``)."""
    heredocs: tuple[Heredoc, ...] = ()
    """The here-documents it opens, in order (``RUN``, ``COPY`` and ``ADD`` only)."""

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}"

    @property
    def text(self) -> str:
        """The instruction as one line, for progress and messages."""
        flags = "".join(f"--{k}={v} " for k, v in self.flags.items())
        return f"{self.keyword} {flags}{self.args}".strip()

    def error(self, message: str) -> ImageBuildError:
        return ImageBuildError(f"{self.where}: {self.keyword}: {message}")


def _directives(raw_lines: Sequence[str], source: str) -> tuple[str, int]:
    """The escape character and the index of the first line after the parser directives (comment
    lines of the form ``# key=value`` at the very top)."""
    escape = "\\"
    start = 0
    for number, raw in enumerate(raw_lines):
        match = _DIRECTIVE.match(raw.strip())
        if not match:
            break
        key, value = match.group(1).lower(), match.group(2)
        if key == "escape":
            if value not in ("\\", "`"):
                raise ImageBuildError(f"{source}:{number + 1}: the escape directive must be '\\' or '`', got {value!r}")
            escape = value
        start = number + 1
    return escape, start


def _heredoc_names(keyword: str, args: str) -> list[tuple[str, bool, bool]]:
    """``(terminator, strip tabs, expand)`` of each ``<<WORD`` among ``args``' words."""
    if keyword.upper() not in HEREDOC_KEYWORDS or "<<" not in args:
        return []
    found = []
    for word in args.split():
        match = _HEREDOC.match(word)
        if match is not None:
            found.append((match.group(3), match.group(1) == "-", not match.group(2)))
    return found


def _read_heredocs(
    names: list[tuple[str, bool, bool]], raw_lines: Sequence[str], number: int, first: int, source: str
) -> tuple[tuple[Heredoc, ...], int]:
    """The bodies of ``names``, read from ``raw_lines[number:]``; and the index after the last terminator."""
    docs: list[Heredoc] = []
    for name, strip_tabs, expand_body in names:
        body: list[str] = []
        while True:
            if number >= len(raw_lines):
                raise ImageBuildError(f"{source}:{first}: the heredoc <<{name} never ends (no line {name!r})")
            line = raw_lines[number].lstrip("\t") if strip_tabs else raw_lines[number]
            number += 1
            if line == name:
                break
            body.append(line + "\n")
        docs.append(Heredoc(name, "".join(body), expand_body))
    return tuple(docs), number


def _logical_lines(text: str, source: str) -> list[tuple[int, str, tuple[Heredoc, ...]]]:
    """(first line number, instruction text, its heredocs) with continuations joined and comments dropped."""
    if len(text) > MAX_DOCKERFILE_CHARS:
        raise ImageBuildError(
            f"{source}: is {len(text)} characters long, more than sandrl reads ({MAX_DOCKERFILE_CHARS}); "
            "a Dockerfile is a recipe: move data into files of the build context and COPY them"
        )
    raw_lines = text.splitlines()
    escape, number = _directives(raw_lines, source)
    lines: list[tuple[int, str, tuple[Heredoc, ...]]] = []
    current: list[str] = []
    first = 0
    while number < len(raw_lines):
        stripped = raw_lines[number].strip()
        number += 1
        if stripped.startswith("#") or not stripped:
            continue  # comments, and empty lines (inside a continued instruction too), are dropped
        if not current:
            first = number
        if stripped.endswith(escape) and not stripped.endswith(escape * 2):
            current.append(stripped[:-1])
            continue
        current.append(stripped)
        joined = " ".join(part.strip() for part in current if part.strip())
        current = []
        keyword, *args = joined.split(None, 1)
        docs, number = _read_heredocs(_heredoc_names(keyword, "".join(args)), raw_lines, number, first, source)
        lines.append((first, joined, docs))
    if current:
        raise ImageBuildError(f"{source}:{first}: the instruction's last line ends with {escape!r} (a continuation)")
    return lines


def json_array(args: str) -> tuple[str, ...] | None:
    """``args`` as Docker's JSON form reads it: a JSON array of strings, else None (the shell form;
    Docker runs a malformed array as a shell command too)."""
    if not args.startswith("["):
        return None
    try:
        value = json.loads(args)
    except (ValueError, RecursionError):  # RecursionError: arrays nested thousands deep
        return None
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return tuple(value)
    return None


def parse_dockerfile(text: str, source: str = "Dockerfile") -> list[Instruction]:
    """Every instruction of ``text``; ``source`` names the file in error messages."""
    out: list[Instruction] = []
    for line, body, docs in _logical_lines(text, source):
        match = _KEYWORD.match(body)
        if match is None:
            raise ImageBuildError(f"{source}:{line}: cannot read {body[:80]!r}: an instruction starts with a keyword")
        keyword, rest = match.group(1).upper(), (match.group(3) or "").strip()
        flags: dict[str, str] = {}
        while rest.startswith("--"):
            word, _, remainder = rest.partition(" ")
            flag = _FLAG.match(word)
            if flag is None:
                raise ImageBuildError(f"{source}:{line}: {keyword}: cannot read the option {word!r}")
            flags[flag.group(1)] = flag.group(2) if flag.group(2) is not None else "true"
            rest = remainder.strip()
        out.append(Instruction(keyword, rest, line, source, flags, json_array(rest), docs))
    return out


def only_workdir_over(instructions: Sequence[Instruction], image: str) -> bool:
    """The Dockerfile starts from ``image`` and only says where to work (``WORKDIR``, which a
    sandbox's spec carries anyway): its image is ``image`` itself."""
    return bool(instructions) and all(
        (i.keyword == "FROM" and i.args.split()[:1] == [image]) or i.keyword == "WORKDIR" for i in instructions
    )


def _lookup(name: str, env: Mapping[str, str], where: str) -> str:
    return env.get(name, "")


def _expand_braced(text: str, i: int, env: Mapping[str, str], where: str) -> tuple[str, int]:
    """``${...}`` starting at ``text[i] == '{'``; return the value and the index after ``}``."""
    end = text.find("}", i)
    if end < 0:
        raise ImageBuildError(f"{where}: missing '}}' in {text!r}")
    body = text[i + 1 : end]
    match = _NAME.match(body)
    if match is None:
        raise ImageBuildError(f"{where}: bad substitution ${{{body}}}")
    name, rest = match.group(0), body[match.end() :]
    value = env.get(name)
    if not rest:
        return value or "", end + 1
    if rest.startswith(":-"):
        return (value if value else expand(rest[2:], env, where)), end + 1
    if rest.startswith(":+"):
        return (expand(rest[2:], env, where) if value else ""), end + 1
    raise ImageBuildError(f"{where}: unsupported substitution ${{{body}}} (use ${{VAR}}, ${{VAR:-x}} or ${{VAR:+x}})")


def expand(text: str, env: Mapping[str, str], where: str) -> str:
    """``text`` with variables substituted (no word splitting, quotes kept)."""
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char == "\\" and i + 1 < len(text) and text[i + 1] == "$":
            out.append("$")
            i += 2
        elif char == "$" and i + 1 < len(text) and text[i + 1] == "{":
            value, i = _expand_braced(text, i + 1, env, where)
            out.append(value)
        elif char == "$" and (match := _NAME.match(text, i + 1)) is not None:
            out.append(_lookup(match.group(0), env, where))
            i = match.end()
        else:
            out.append(char)
            i += 1
    return "".join(out)


def words(text: str, env: Mapping[str, str], where: str) -> list[str]:
    """Split ``text`` into words as Docker does: quotes grouped and removed, variables substituted."""
    result: list[str] = []
    current: list[str] = []
    in_word = False
    i = 0
    while i < len(text):
        char = text[i]
        if char.isspace():
            if in_word:
                result.append("".join(current))
                current, in_word = [], False
            i += 1
            continue
        in_word = True
        if char == "\\" and i + 1 < len(text):
            current.append(text[i + 1])
            i += 2
        elif char == "'":
            end = text.find("'", i + 1)
            if end < 0:
                raise ImageBuildError(f"{where}: unmatched ' in {text!r}")
            current.append(text[i + 1 : end])
            i = end + 1
        elif char == '"':
            i += 1
            while i < len(text) and text[i] != '"':
                if text[i] == "\\" and i + 1 < len(text) and text[i + 1] in '"\\$':
                    current.append(text[i + 1])
                    i += 2
                elif text[i] == "$":
                    value, i = _dollar(text, i, env, where)
                    current.append(value)
                else:
                    current.append(text[i])
                    i += 1
            if i >= len(text):
                raise ImageBuildError(f'{where}: unmatched " in {text!r}')
            i += 1
        elif char == "$":
            value, i = _dollar(text, i, env, where)
            current.append(value)
        else:
            current.append(char)
            i += 1
    if in_word:
        result.append("".join(current))
    return result


def _dollar(text: str, i: int, env: Mapping[str, str], where: str) -> tuple[str, int]:
    """The substitution at ``text[i] == '$'``; a lone ``$`` is itself."""
    if i + 1 < len(text) and text[i + 1] == "{":
        return _expand_braced(text, i + 1, env, where)
    match = _NAME.match(text, i + 1)
    if match is None:
        return "$", i + 1
    return _lookup(match.group(0), env, where), match.end()


def argument_words(inst: Instruction, env: Mapping[str, str]) -> list[str]:
    """The arguments of ``inst`` as words (``COPY``'s sources and destination...): the JSON form's
    items, each substituted, else the shell form split by :func:`words`."""
    if inst.exec_form is not None:
        return [expand(item, env, inst.where) for item in inst.exec_form]
    return words(inst.args, env, inst.where)


def key_values(inst: Instruction, env: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """``ENV``/``ARG``/``LABEL`` arguments: ``K=V`` pairs (``K`` alone gives None; ``ENV K V`` the legacy form)."""
    parts = words(inst.args, env, inst.where)
    if not parts:
        raise inst.error("needs at least one name")
    if inst.keyword == "ENV" and "=" not in parts[0]:
        if len(parts) < 2:
            raise inst.error(f"{parts[0]} needs a value (ENV NAME=value)")
        # Legacy "ENV NAME value with spaces": the rest of the line, substituted, is the value.
        name, _, rest = inst.args.strip().partition(" ")
        return [(name, " ".join(words(rest, env, inst.where)))]
    pairs: list[tuple[str, str | None]] = []
    for part in parts:
        name, sep, value = part.partition("=")
        if not _NAME.fullmatch(name):
            raise inst.error(f"{name!r} is not a valid variable name")
        pairs.append((name, value if sep else None))
    return pairs
