"""``sandrl view RUN_DIR``: a training run's or an eval's page, served on loopback or written as one file."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from sandrl.cli.output import emit, err_console
from sandrl.errors import ConfigError

if TYPE_CHECKING:
    from sandrl.view.run_view import RunView

app = typer.Typer()


def view_command(run_dir: str | Path) -> str:
    """The command line that opens a run's page (what ``sandrl train``, ``eval`` and ``make demo`` print)."""
    return f"sandrl view {run_dir}"


@app.command("view")
def view(
    run_dir: Path = typer.Argument(..., help="A run's output directory, or an eval's results directory."),
    port: int = typer.Option(8760, help="Port on 127.0.0.1 (0: any free one; taken: the next free one)."),
    out: Path | None = typer.Option(
        None, "--out", help="Write the page as one self-contained HTML file instead of serving it."
    ),
    max_episodes: int = typer.Option(
        200, help="With --out: episodes the file holds (whole groups, spread over the run)."
    ),
    model: str | None = typer.Option(
        None,
        help="The model whose tokenizer decodes the ids (default: the run's newest checkpoint, else its config's).",
    ),
) -> None:
    """Curves, tasks and every episode, turn by turn: while the run goes on and after."""
    from sandrl.view.run_files import RunFiles
    from sandrl.view.run_view import RunView

    view = RunView(RunFiles.open(run_dir), model=model)
    if out is not None:
        from sandrl.view.report_file import write_report

        if max_episodes < 0:
            raise ConfigError(f"--max-episodes must be 0 or more, got {max_episodes}")
        with err_console.status(f"reading {run_dir}"):
            written = write_report(view, out, max_episodes=max_episodes)
        err_console.print(
            f"wrote {out}: {written['episodes']} of {written['of']} episodes, "
            f"{written['bytes'] / 1e6:.1f} MB (`sandrl view {run_dir}` reads them all)",
            highlight=False,
        )
        emit(written)
        return
    serve(view, port)


def serve(view: RunView, port: int) -> None:
    """Serve ``view``'s page on 127.0.0.1 until Ctrl-C."""
    from sandrl.background_server import BackgroundServer
    from sandrl.view.app import create_app

    view.start()
    server = BackgroundServer(create_app(view), "127.0.0.1", free_port(port), name="viewer").start()
    err_console.print(f"sandrl view: {server.url}/  (Ctrl-C stops it)", highlight=False)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


def free_port(port: int, tries: int = 20) -> int:
    """``port`` if it is free on 127.0.0.1, else the next free one (0: any)."""
    if not 0 <= port < 65536:
        raise ConfigError(f"--port must be 0-65535, got {port}")
    if port == 0:
        return 0
    for candidate in range(port, min(port + tries, 65536)):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("127.0.0.1", candidate))
            except OSError:
                continue
            return candidate
    return 0
