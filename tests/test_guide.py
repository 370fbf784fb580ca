"""The user guide (docs/guide/) against the code: its links lead somewhere, its commands exist as written.

Each ``sandrl ...`` line of the guide's shell blocks is parsed by the real command line (its
sub-commands and options), without running it; each relative link must
name a file of the repository, and each ``#anchor`` a heading of the page it points into.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sandrl.cli import app

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guide"
PAGES = sorted(GUIDE.glob("*.md"))
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to dashes."""
    found = set()
    for line in page.read_text().splitlines():
        if heading := re.match(r"#+ (.+)", line):
            found.add(re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-"))
    return found


def _commands(page: Path) -> Iterator[tuple[int, list[str]]]:
    """(line number, argv after ``sandrl``) of each ``sandrl`` command in the page's sh blocks."""
    in_block = False
    lines = page.read_text().splitlines()
    for number, line in enumerate(lines, start=1):
        if line.startswith("```"):
            in_block = line.strip() == "```sh"
            continue
        if not in_block:
            continue
        text = line
        while text.endswith("\\") and number < len(lines):
            text = text[:-1] + lines[number]
            number += 1
        lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        words: list[str] = []
        for word in [*lexer, ";"]:
            if word not in ("&&", "||", ";", "|", "&", "(", ")"):
                words.append(word)
                continue
            while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
                words.pop(0)  # PYTHONPATH=. sandrl ...
            if words and words[0] == "sandrl":
                yield number, words[1:]
            words = []


def test_the_guide_has_its_pages_and_the_readme_links_it() -> None:
    names = {p.name for p in PAGES}
    expected = {"README.md", "install.md", "quickstart.md", "concepts.md", "config-reference.md"}
    assert expected | {"tasks.md", "agents.md", "outputs.md", "scale.md"} <= names
    assert "(docs/guide/README.md)" in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_of_the_guide_leads_somewhere(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists() or (anchor and file.suffix == ".md" and anchor not in _anchors(file)):
            broken.append(target)
    assert broken == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_sandrl_command_of_the_guide_parses(page: Path) -> None:
    wrong = []
    for number, argv in _commands(page):
        problem = _problem(argv)
        if problem:
            wrong.append(f"{page.name}:{number}: sandrl {shlex.join(argv)}: {problem}")
    assert wrong == []


def test_a_command_the_code_does_not_have_is_caught() -> None:
    assert _problem(["train", "configs/tiny.toml", "--steps", "2", "--set", "train.lr=3e-5"]) == ""
    assert "No such option: --stepz" in _problem(["train", "x.toml", "--stepz", "2"])
    assert "No such command" in _problem(["sandbox", "lss"])
    assert "No such option" in _problem(["eval", "builtin", "--limitt", "4"])


def _problem(argv: list[str]) -> str:
    """What the command line says of ``argv`` (empty if it parses): with ``--help`` appended, every
    sub-command and option is parsed and nothing runs."""
    result = CliRunner().invoke(app, [*argv, "--help"])
    return "" if result.exit_code == 0 else (result.output or repr(result.exception)).strip()
