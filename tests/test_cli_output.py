"""``sandrl.cli.output``: the one JSON line every command ends with, and the console ``--json`` silences."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandrl.cli.output import emit, print_error, rich_console


def test_emit_prints_one_json_line_and_writes_the_same_line_to_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "result.json"
    emit({"bench": "x", "n": 1}, out)
    assert capsys.readouterr().out == '{"bench": "x", "n": 1}\n' == out.read_text()
    emit({"bench": "y"})
    assert capsys.readouterr().out == '{"bench": "y"}\n'


def test_a_quiet_console_prints_nowhere(capsys: pytest.CaptureFixture[str]) -> None:
    rich_console(quiet=True).print("a card")
    rich_console(quiet=True, stderr=False, wide=True).print("a table")
    assert capsys.readouterr() == ("", "")


def test_a_wide_console_keeps_a_piped_card_whole() -> None:
    assert rich_console(wide=True).width == 140  # stderr is not a terminal under pytest
    assert rich_console().stderr and not rich_console(stderr=False).stderr


def test_an_error_prints_its_brackets_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    # Rich markup ate "[run]" and raised on "[/x]": text from a config, a task or a verifier is text.
    print_error("run.toml: [run]: unknown key(s) stepz; see [/tmp/x] and [bold]")
    assert capsys.readouterr().err == "error: run.toml: [run]: unknown key(s) stepz; see [/tmp/x] and [bold]\n"
