"""Dockerfile instructions, read as Docker reads them: what :mod:`.builder` executes.

:func:`parse_dockerfile` turns a Dockerfile into :class:`Instruction` s, one per logical line:
parser directives (``# escape=``), comments, line continuations, ``--flag=value`` options and
the JSON-array ("exec") and shell forms. :func:`words` splits an argument string into words the
way Docker does, with quotes, escapes and ``$VAR`` / ``${VAR}`` / ``${VAR:-default}`` /
``${VAR:+alternative}`` substitution. Which instructions are supported is the builder's business;
here every instruction is read, and a malformed one raises
:class:`~sandrl.errors.ImageBuildError` naming the file and the line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from sandrl.errors import ImageBuildError

_DIRECTIVE = re.compile(r"^#\s*([a-zA-Z][a-zA-Z0-9]*)\s*=\s*(.+?)\s*$")
_KEYWORD = re.compile(r"^([A-Za-z]+)(\s+(.*))?$", re.DOTALL)
_FLAG = re.compile(r"^--([a-z][a-z0-9-]*)(?:=(.*))?$", re.DOTALL)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


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


def _logical_lines(text: str, source: str) -> list[tuple[int, str]]:
    """(first line number, instruction text) with continuations joined and comments dropped."""
    raw_lines = text.splitlines()
    escape = "\\"
    start = 0
    # Parser directives: comment lines of the form "# key=value" at the very top.
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
    lines: list[tuple[int, str]] = []
    current: list[str] = []
    first = 0
    for number in range(start, len(raw_lines)):
        stripped = raw_lines[number].strip()
        if stripped.startswith("#") or (current and not stripped):
            continue  # comments, and empty lines inside a continued instruction, are dropped
        if not stripped:
            continue
        if not current:
            first = number + 1
        if stripped.endswith(escape) and not stripped.endswith(escape * 2):
            current.append(stripped[:-1])
            continue
        current.append(stripped)
        lines.append((first, " ".join(part.strip() for part in current if part.strip())))
        current = []
    if current:
        raise ImageBuildError(f"{source}:{first}: the instruction's last line ends with {escape!r} (a continuation)")
    return lines


def _exec_form(args: str) -> tuple[str, ...] | None:
    if not args.startswith("["):
        return None
    try:
        value = json.loads(args)
    except ValueError:
        return None  # Docker runs a malformed array as a shell command too
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return tuple(value)
    return None


def parse_dockerfile(text: str, source: str = "Dockerfile") -> list[Instruction]:
    """Every instruction of ``text``; ``source`` names the file in error messages."""
    out: list[Instruction] = []
    for line, body in _logical_lines(text, source):
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
        if rest.startswith("<<"):
            raise ImageBuildError(
                f"{source}:{line}: {keyword}: heredocs (<<EOF) are not supported by sandrl's builder; "
                "put the script in a file and COPY it"
            )
        out.append(Instruction(keyword, rest, line, source, flags, _exec_form(rest)))
    return out


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
