"""``sandrl.cli.output``: the one JSON line every command ends with, and the console ``--json`` silences."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from sandrl.cli.output import emit, print_error, rich_console
from sandrl.rollout.summary import print_failures
from sandrl.rollout.trajectory import Trajectory


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


def test_an_error_and_a_failed_episode_print_their_brackets_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    # Rich markup ate "[run]" and raised on "[/x]": text from a config, a task or a verifier is text.
    print_error("run.toml: [run]: unknown key(s) stepz; see [/tmp/x] and [bold]")
    assert capsys.readouterr().err == "error: run.toml: [run]: unknown key(s) stepz; see [/tmp/x] and [bold]\n"
    failed = Trajectory(
        "e/0",
        "e",
        "[task] [/x]",
        0,
        "test",
        "completed",
        reward=0.0,
        verifier={"exit_code": 1, "stdout_tail": "[gw0] FAILED [/y]"},
    )
    console = Console(file=io.StringIO(), width=200)
    print_failures([failed], console)
    line = console.file.getvalue()  # type: ignore[attr-defined]
    assert line.startswith("fail [task] [/x] #0 (completed, reward 0): verifier exit 1"), line
    assert "[gw0] FAILED [/y]" in line, line
