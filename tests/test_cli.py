"""The ``sandrl`` command as a user runs it: real sandboxes; real processes where only a process shows
what is checked (the output and exit code of a sandbox's command, the warnings' format, the version).
The others run by the command's entry point in this process (:func:`tests.entry_point.run_sandrl`,
:func:`run_here`), a new process's second of imports spared: the exit code and output are the same."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .entry_point import run_sandrl
from .support import needs_sandbox

SANDRL = Path(sys.executable).with_name("sandrl")


def run(args: list[str], state_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "SANDRL_STATE_DIR": str(state_dir), **env}
    return subprocess.run([str(SANDRL), *args], capture_output=True, text=True, env=full_env, timeout=120)


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cli-state")


RunHere = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def run_here(
    state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> RunHere:
    """:func:`run`'s command by its entry point in this process; ``columns`` wide, ``env`` set."""

    def run(args: list[str], *, columns: int | None = None, **env: str) -> subprocess.CompletedProcess[str]:
        return run_sandrl(
            args, cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys, state_dir=state_dir, columns=columns, env=env
        )

    return run


@needs_sandbox
def test_sandbox_run_prints_output_and_exit_code(state_dir: Path) -> None:
    r = run(["sandbox", "run", "--", "sh", "-c", "echo out; echo err >&2; exit 7"], state_dir)
    assert r.returncode == 7
    assert r.stdout == "out\n"
    assert r.stderr == "err\n"


@needs_sandbox
def test_sandbox_run_timeout_exits_124(state_dir: Path) -> None:
    r = run(["sandbox", "run", "--timeout", "1", "--", "sleep", "30"], state_dir)
    assert r.returncode == 124
    assert "timed out" in r.stderr


@needs_sandbox
def test_sandbox_run_quotes_arguments(state_dir: Path) -> None:
    r = run(["sandbox", "run", "--", "printf", "%s|", "a b", "$HOME", "'q'"], state_dir)
    assert r.stdout == "a b|$HOME|'q'|"


def test_bad_argument_is_one_clear_line(run_here: RunHere) -> None:
    r = run_here(["sandbox", "run", "--cpus", "-1", "--", "true"])
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert "cpus must be between" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_missing_bwrap_is_one_clear_line(run_here: RunHere) -> None:
    if os.geteuid() != 0:
        pytest.skip("the root check comes first when not root")
    # Only a host that asks for bubblewrap's launcher needs it (every launch is the helper's by default).
    r = run_here(["sandbox", "run", "--", "true"], PATH="/nonexistent", SANDRL_LAUNCHER="bubblewrap")
    assert r.returncode == 2
    assert "bubblewrap is not installed" in r.stderr
    assert "Traceback" not in r.stderr


def test_warnings_are_one_line_each(state_dir: Path, tmp_path: Path) -> None:
    task = tmp_path / "odd"
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "task.toml").write_text('[environment]\ndocker_image = "python:3.12"\nspeling_mistake = 1\n')
    (task / "instruction.md").write_text("Do it.\n")
    (task / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    r = run(["tasks", "list", str(tmp_path)], state_dir)
    assert r.returncode == 0, r.stderr
    lines = r.stderr.strip().splitlines()
    # Python's own format adds the source line of the warnings.warn call under the message.
    assert lines == [
        f"warning: {task / 'task.toml'}: unknown keys environment.speling_mistake are kept in Task.extra but "
        "not acted on; check their spelling against Harbor's task.toml reference"
    ]


def test_another_librarys_warning_keeps_its_category_and_place(capsys: pytest.CaptureFixture[str]) -> None:
    from sandrl.cli.output import show_warning

    show_warning(DeprecationWarning("old API\nuse the new one"), DeprecationWarning, "/lib/thing.py", 12)
    assert capsys.readouterr().err == "warning: old API use the new one (DeprecationWarning, /lib/thing.py:12)\n"


@needs_sandbox
def test_eval_with_no_episode_able_to_run_exits_non_zero(run_here: RunHere, tmp_path: Path) -> None:
    task = tmp_path / "unbuildable"
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "task.toml").write_text("")
    (task / "instruction.md").write_text("Do nothing.\n")
    (task / "environment" / "Dockerfile").write_text("FROM host\nRUN exit 3\n")
    (task / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    r = run_here(["eval", str(task), "--agent", "oracle", "--results-dir", str(tmp_path / "eval")])
    assert r.returncode == 1, r.stderr
    assert '"verified": 0' in r.stdout  # the JSON line still ends the output, for scripts
    assert "error: no episode could run: all 1 ended without a reward (image_build_failed x1)" in r.stderr


@needs_sandbox
@pytest.mark.parametrize(
    ("args", "env"),
    [
        (["serve", "sandboxes", "--port", "0", "--egress-allow", "8.8.8.0/24"], {}),
        (["sandbox", "run", "--network", "--", "true"], {"SANDRL_EGRESS_ALLOW": "169.254.0.0/16"}),
    ],
)
def test_an_egress_allow_list_past_the_private_ranges_is_one_clear_line(
    run_here: RunHere, args: list[str], env: dict[str, str]
) -> None:
    r = run_here(args, **env)
    assert r.returncode == 2, r
    assert "Traceback" not in r.stderr
    assert "egress allow-list entry" in r.stderr


def test_tasks_list_takes_builtin(run_here: RunHere) -> None:
    # `sandrl eval builtin` runs the shipped suite; the `tasks` commands take the same name.
    r = run_here(["tasks", "list", "builtin"], columns=200)
    assert r.returncode == 0, r.stderr
    assert "fix-word-frequency" in r.stdout
    assert r.stdout.strip().endswith(" tasks, 0 problems")


def _commands(command: Any, path: list[str]) -> Iterator[tuple[list[str], Any]]:
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, [*path, name])


def test_every_help_keeps_its_bracketed_words() -> None:
    # Rich markup ate them: `sandrl train --help` read "(default:  mode)" and "needs a  section".
    from typer.main import get_command
    from typer.testing import CliRunner

    from sandrl.cli import app

    runner = CliRunner()
    checked: list[str] = []
    for path, command in _commands(get_command(app), []):
        texts = [command.help or "", *(getattr(p, "help", None) or "" for p in command.params)]
        bracketed = [word for text in texts for word in re.findall(r"\[[^\]\s]+\]", text)]
        result = runner.invoke(app, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        shown = " ".join(result.output.split())
        for word in bracketed:
            assert word in shown, (path, word, result.output)
            checked.append(word)
    assert {"[run]", "[cluster]", "[/variant]"} <= set(checked)


def test_each_sandboxes_help_says_what_that_command_takes_without_it() -> None:
    # One text for all said "default: [rollout]'s, local", and `tasks run` has no [rollout].
    from typer.main import get_command

    from sandrl.cli import app

    defaults = {
        ("eval",): "default: [rollout]'s, local.",
        ("tasks", "run"): "default: local.",
        ("tasks", "validate"): "default: local.",
        ("bench", "rollout"): "default: local.",
        ("demo",): "default: the demo's, local.",
    }
    said = {
        tuple(path): param.help
        for path, command in _commands(get_command(app), [])
        for param in getattr(command, "params", [])
        if "--sandboxes" in getattr(param, "opts", [])
    }
    assert said.keys() == defaults.keys()
    for path, default in defaults.items():
        assert said[path].endswith(default), (path, said[path])


def test_version() -> None:
    r = subprocess.run([str(SANDRL), "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert re.fullmatch(r"sandrl \d+\.\d+\S*\n", r.stdout), r.stdout


@pytest.mark.parametrize(
    ("toml", "said"),
    [
        ('[run]\nstepz = 1\n[tasks]\nfamily = "echo"\n', "[run]: unknown key(s) stepz; valid keys are output_dir"),
        ('[tasks]\nfamily = "echo"\n[train.loss]\nloss_typo = 1\n', "[train.loss]: unknown key(s) loss_typo"),
        ("[run]\nsteps = 2\n", "a [tasks] section is required"),
        (
            '[tasks]\nfamily = "echo"\n[rollout.timeouts]\nsetup_timeout_s = "long"\n',
            "[rollout.timeouts] setup_timeout_s must be a number",
        ),
        (
            '[tasks]\nfamily = "echo"\n[async]\nupdate_interval = 5\n',
            "[async]: update_interval (5) > max_staleness + 1",
        ),
        ('[tasks]\nfamily = "echo"\n[train]\nlr = -1.0\n', "[train]: lr must be a finite number > 0"),
        # A closing tag that opens nothing made rich raise: a traceback instead of the message.
        ('[tasks]\nfamily = "[/oops] [bold]"\n', "'[/oops] [bold]'"),
    ],
)
def test_a_config_error_keeps_its_section_names(run_here: RunHere, tmp_path: Path, toml: str, said: str) -> None:
    config = tmp_path / "run.toml"
    config.write_text(toml)
    r = run_here(["train", str(config)])
    assert r.returncode == 2, r
    assert "Traceback" not in r.stderr
    assert r.stderr.startswith(f"error: {config}: "), r.stderr
    assert said in " ".join(r.stderr.split()), r.stderr
