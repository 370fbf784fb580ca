"""Reading Dockerfiles: continuations, comments, forms, options, and Docker's word and variable rules."""

from __future__ import annotations

import pytest

from sandrl.errors import ImageBuildError
from sandrl.images.dockerfile import (
    MAX_DOCKERFILE_CHARS,
    argument_words,
    expand,
    key_values,
    only_workdir_over,
    parse_dockerfile,
    words,
)

DOCKERFILE = """\
# a comment
FROM host

RUN echo one \\
    # a comment inside is dropped
    two
COPY --chown=1000:1000 --chmod=644 ["a b", "/dst/"]
ENV A=1 B="two words" C=${A}x
CMD ["python3", "app.py"]
"""


def test_parse_lines_forms_and_flags() -> None:
    insts = parse_dockerfile(DOCKERFILE, "Df")
    assert [(i.keyword, i.line) for i in insts] == [("FROM", 2), ("RUN", 4), ("COPY", 7), ("ENV", 8), ("CMD", 9)]
    run = insts[1]
    assert run.args == "echo one two" and run.exec_form is None
    copy = insts[2]
    assert copy.flags == {"chown": "1000:1000", "chmod": "644"}
    assert copy.exec_form == ("a b", "/dst/")
    assert insts[4].exec_form == ("python3", "app.py")
    assert key_values(insts[3], {}) == [("A", "1"), ("B", "two words"), ("C", "x")]


def test_escape_directive_and_legacy_env() -> None:
    insts = parse_dockerfile("# escape=`\nFROM host\nRUN echo a `\n  b\nENV NAME some value\n")
    assert insts[1].args == "echo a b"
    assert key_values(insts[2], {}) == [("NAME", "some value")]


def test_words_quotes_and_substitution() -> None:
    env = {"HOME": "/root", "EMPTY": ""}
    assert words("a 'b c' \"$HOME/x\" ${HOME}y \\$HOME", env, "w") == ["a", "b c", "/root/x", "/rooty", "$HOME"]
    assert words("${EMPTY:-dflt} ${HOME:+set} ${NOPE:+set}x", env, "w") == ["dflt", "set", "x"]
    assert expand("$HOME and ${MISSING}.", env, "w") == "/root and ."


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("FROM host\nRUN <<EOF\necho\n", "Df:2: the heredoc <<EOF never ends"),
        ("FROM host\nRUN echo \\\n", "Df:2: the instruction's last line ends"),
        ("FROM host\n--oops\n", "Df:2: cannot read"),
    ],
)
def test_malformed_names_file_and_line(text: str, message: str) -> None:
    with pytest.raises(ImageBuildError, match=message):
        parse_dockerfile(text, "Df")


def test_heredocs_are_read_with_their_bodies() -> None:
    text = (
        "FROM host\n"
        "RUN <<EOF\n"
        "WORKDIR /not/an/instruction\n"
        "EOF\n"
        "COPY <<-'one' <<two /dst/\n"
        "\t$KEPT\n"
        "\tone\n"
        "x\n"
        "two\n"
        'RUN echo "<<not" a heredoc\n'
        "WORKDIR /after\n"
    )
    insts = parse_dockerfile(text, "Df")
    assert [(i.keyword, i.line) for i in insts] == [("FROM", 1), ("RUN", 2), ("COPY", 5), ("RUN", 10), ("WORKDIR", 11)]
    (run,) = insts[1].heredocs
    assert (run.name, run.body, run.expand) == ("EOF", "WORKDIR /not/an/instruction\n", True)
    one, two = insts[2].heredocs
    assert (one.name, one.body, one.expand) == ("one", "$KEPT\n", False)
    assert (two.name, two.body) == ("two", "x\n")
    assert insts[3].heredocs == () and insts[3].args == 'echo "<<not" a heredoc'


def test_continuations_follow_the_escape_directive_and_drop_blank_lines() -> None:
    # The three readers differed here: the task loader joined "\" under "# escape=`" and ended an
    # instruction at a blank line inside a continuation; Docker (and now every reader) does neither.
    insts = parse_dockerfile("# escape=`\nFROM host\nRUN echo \\\nWORKDIR /srv\nRUN a `\n\n  b\n")
    assert [(i.keyword, i.args) for i in insts] == [
        ("FROM", "host"),
        ("RUN", "echo \\"),
        ("WORKDIR", "/srv"),
        ("RUN", "a b"),
    ]


def test_hostile_sizes_are_refused_not_crashed_on() -> None:
    with pytest.raises(ImageBuildError, match=r"Df: is \d+ characters long, more than sandrl reads"):
        parse_dockerfile("FROM host\n" + "RUN true\n" * (MAX_DOCKERFILE_CHARS // 9 + 1), "Df")
    deep_array = "[" * 100_000 + "]" * 100_000
    (cmd,) = parse_dockerfile(f"CMD {deep_array}\n")
    assert cmd.exec_form is None  # not an array of strings: the shell form, as Docker reads it


def test_only_workdir_over() -> None:
    assert only_workdir_over(parse_dockerfile("FROM --platform=linux/amd64 host\nWORKDIR /w\n"), "host")
    assert not only_workdir_over(parse_dockerfile("FROM host\nENV A=1\n"), "host")
    assert not only_workdir_over(parse_dockerfile("FROM debian\n"), "host")
    assert not only_workdir_over([], "host")


def test_argument_words_of_both_forms() -> None:
    json_form, shell_form = parse_dockerfile('COPY ["$A b", "/d/"]\nCOPY "$A b" \'$A\' /d/\n')
    assert argument_words(json_form, {"A": "x"}) == ["x b", "/d/"]
    assert argument_words(shell_form, {"A": "x"}) == ["x b", "$A", "/d/"]
