"""Reading Dockerfiles: continuations, comments, forms, options, and Docker's word and variable rules."""

from __future__ import annotations

import pytest

from sandrl.errors import ImageBuildError
from sandrl.sandbox.bwrap.dockerfile.instructions import expand, key_values, parse_dockerfile, words

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
        ("FROM host\nRUN <<EOF\necho\nEOF\n", "Df:2: RUN: heredocs"),
        ("FROM host\nRUN echo \\\n", "Df:2: the instruction's last line ends"),
        ("FROM host\n--oops\n", "Df:2: cannot read"),
    ],
)
def test_malformed_names_file_and_line(text: str, message: str) -> None:
    with pytest.raises(ImageBuildError, match=message):
        parse_dockerfile(text, "Df")
