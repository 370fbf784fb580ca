"""``sandrl ARGS`` run by its entry point (:func:`sandrl.cli.main`) in the test process.

What a test of a command's output checks (its exit code, stdout and stderr, the files it writes)
comes out the same as from the installed command in a subprocess, without the seconds a new
process spends importing torch before it reads its arguments. Tests of what only a process of its
own shows (signals, the imports a command makes, a crash) run the installed command.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import sandrl.sandbox.bwrap.provider
from sandrl.cli import main
from sandrl.cli.output import err_console


def run_sandrl(
    args: list[str],
    *,
    cwd: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    state_dir: Path | None = None,
    columns: int | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``sandrl ARGS`` in ``cwd``, its sandboxes' store ``state_dir`` (``$SANDRL_STATE_DIR``), its stderr
    ``columns`` wide (``$COLUMNS``), with the variables ``env`` set: its exit code and what it printed,
    as ``subprocess.run`` gives them."""
    capsys.readouterr()  # what came before is not this command's
    argv = ["sandrl", *args]
    with monkeypatch.context() as m:
        m.chdir(cwd)
        m.setattr(sys, "argv", argv)
        for name, value in (env or {}).items():
            m.setenv(name, value)
        if state_dir is not None:  # read when the provider module is imported, as the command's process does
            m.setattr(sandrl.sandbox.bwrap.provider, "DEFAULT_STATE_DIR", state_dir)
        if columns is not None:  # the console read $COLUMNS when it was made, at import
            m.setenv("COLUMNS", str(columns))
            m.setattr(err_console, "_width", columns)
        try:
            main()
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 1
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(argv, code, out, err)
