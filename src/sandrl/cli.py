"""The ``sandrl`` command.

Thin: each sub-command parses its arguments and calls the component that does the work.
Errors sandrl raises on purpose (:class:`sandrl.errors.SandrlError`) are printed as one
line that says what to do, never as a traceback.
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from sandrl.errors import SandrlError

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Agentic RL post-training with fast sandboxes.")
sandbox_app = typer.Typer(no_args_is_help=True, help="Run commands in sandboxes.")
bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks; each ends with one JSON line.")
serve_app = typer.Typer(no_args_is_help=True, help="Servers: sandboxes, inference.")
app.add_typer(sandbox_app, name="sandbox")
app.add_typer(bench_app, name="bench")
app.add_typer(serve_app, name="serve")

err_console = Console(stderr=True)


def main() -> None:
    """Entry point of the console script."""
    try:
        app()
    except SandrlError as exc:
        err_console.print(f"[bold red]error[/]: {exc.message}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except KeyboardInterrupt:
        err_console.print("[bold red]interrupted[/]")
        sys.exit(130)


if __name__ == "__main__":
    main()
