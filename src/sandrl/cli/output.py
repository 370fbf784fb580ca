"""What the commands print: rich consoles for people, one JSON line for scripts.

Every command that has a result for scripts ends with it as one JSON line on stdout (STYLE.md:
"benchmarks print a card, then one JSON line"); its tables, cards and progress go to a rich
console on stderr, which ``--json`` silences. The few commands whose table *is* the result
(``tasks list``, ``images ls``) print it on stdout.

Text is text: a message, a task id, a path or a sandbox's output is never read as rich markup
(``[run]`` would vanish, ``[/x]`` would raise). Styles are added around it (:func:`print_error`),
and text put into a markup string goes through :func:`rich.markup.escape`.
"""

from __future__ import annotations

import io
import json
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console
from rich.text import Text

# Errors, warnings and the local `sandbox run`'s notes; `main()` prints SandrlError here.
err_console = Console(stderr=True)

SWEBENCH_IMAGES_HELP = (
    "Where SWE-bench instances run: swebench (the published images), epoch (Epoch AI's), swegym (SWE-Gym's), an "
    "image template with {instance_id}, {instance_key} or {swegym_key} and {arch}; 'local': from local clones "
    "(repos/) only; unset: the local clone when there is one, else the published image (SWE-Gym's for its "
    "repositories). SWE-smith's and R2E-Gym's rows run in the image they name."
)
"""The help of ``--swebench-images``, which every command that loads tasks takes."""


def sandboxes_help(default: str) -> str:
    """``--sandboxes`` of every command that runs sandboxes (:func:`sandrl.wiring.open_provider` builds
    them), with what the command takes without it (``default``)."""
    return (
        "'local' (bubblewrap here) or 'e2b' (an E2B-compatible service: E2B_API_KEY, E2B_API_URL...); "
        f"default: {default}."
    )


# A piped card's tables would wrap at rich's default of 80 columns.
_PIPED_WIDTH = 140


def rich_console(*, quiet: bool = False, stderr: bool = True, wide: bool = False) -> Console:
    """A rich console for tables, cards and progress.

    ``quiet``: it prints nowhere (``--json``: only the JSON line reaches the terminal).
    ``stderr``: False for a command whose table is its output.
    ``wide``: 140 columns when the stream is not a terminal, so a piped card keeps its tables whole.
    """
    if quiet:
        return Console(file=io.StringIO())
    if wide:
        stream = sys.stderr if stderr else sys.stdout
        return Console(stderr=stderr, width=None if stream.isatty() else _PIPED_WIDTH)
    return Console(stderr=stderr)


def print_error(message: str, label: str = "error") -> None:
    """``label: message`` as one line on stderr, the label in bold red and the message as written."""
    err_console.print(Text.assemble((label, "bold red"), ": ", message), highlight=False, soft_wrap=True)


def emit(result: Mapping[str, Any], out: Path | None = None) -> None:
    """Print ``result`` as one JSON line on stdout; with ``out``, write the same line to that file too."""
    line = json.dumps(result)
    if out is not None:
        out.write_text(line + "\n")
    print(line)


def show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """Print a warning as one line on stderr (Python's own format adds the source line under it).

    sandrl's warnings (a task setting that cannot be honoured...) say all there is to say:
    ``warning: <message>``. Another library's keep everything but the source line: the message, the
    category and where it was raised.
    """
    text = " ".join(str(message).split("\n"))
    if category.__module__.split(".")[0] != "sandrl" and not filename.startswith(_SANDRL_DIR):
        text += f" ({category.__name__}, {filename}:{lineno})"
    err_console.print(f"warning: {text}", markup=False, highlight=False, soft_wrap=True)


_SANDRL_DIR = str(Path(__file__).resolve().parents[1])


def one_line_warnings() -> None:
    """Install :func:`show_warning` for this process (the CLI does, before any command runs)."""
    warnings.showwarning = show_warning
