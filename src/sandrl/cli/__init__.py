"""The ``sandrl`` command.

Thin: each sub-command parses its arguments and calls the component that does the work.
Errors sandrl raises on purpose (:class:`sandrl.errors.SandrlError`) are printed as one
line that says what to do, never as a traceback; warnings as one line each
(:func:`~sandrl.cli.output.show_warning`).

One module per command group, each with its own ``typer.Typer`` named ``app`` whose commands
are registered with ``@app.command``; this module only mounts them::

    eval.py     sandrl eval
    train.py    sandrl train (and --ray)
    sandbox.py  sandrl sandbox run|ls|gc|rm
    bench.py    sandrl bench service|rollout|train|sandbox|inference|cluster|contention|...
    serve.py    sandrl serve sandboxes|inference
    tasks.py    sandrl tasks list|validate|run
    images.py   sandrl images build|pull|import|ls|prune|rm|templates
    demo.py     sandrl demo [sandbox]
    config.py   sandrl config reference
    view.py     sandrl view RUN_DIR (the run's page)
    output.py   the consoles and the one JSON line every command shares

Every command builds the whole parser before it runs (typer makes every sub-command's options to
find the one asked for), so a command module imports at its top only what its options need:
components (the sandbox provider, the wiring, the task loaders, FastAPI, httpx, PyTorch, Ray) are
imported inside the commands that call them. ``sandrl --help`` stays fast, and nothing imports
Ray without ``--ray`` (``tests/test_cli_import_cost.py``).
"""

from __future__ import annotations

import sys

import typer

from sandrl.cli import bench, config, demo, images, sandbox, serve, tasks, train, view
from sandrl.cli import eval as eval_
from sandrl.cli.output import err_console, one_line_warnings, print_error
from sandrl.errors import SandrlError

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    # Help text is text: rich markup would eat every bracketed word ("needs a [cluster] section").
    rich_markup_mode=None,
    help="Agentic RL post-training with fast sandboxes.",
)


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"sandrl {version('sandrl')}")
        raise typer.Exit()


@app.callback()
def _root(
    _version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print sandrl's version and exit."
    ),
) -> None:
    # Before any command: warnings print as one line each (the loaders warn about task settings).
    one_line_warnings()


# eval and train are mounted without a name: their one command joins the root's.
app.add_typer(eval_.app)
app.add_typer(train.app)
app.add_typer(view.app)
app.add_typer(sandbox.app, name="sandbox")
app.add_typer(bench.app, name="bench")
app.add_typer(serve.app, name="serve")
app.add_typer(tasks.app, name="tasks")
app.add_typer(images.app, name="images")
app.add_typer(demo.app, name="demo")
app.add_typer(config.app, name="config")


def main() -> None:
    """Entry point of the console script."""
    try:
        app()
    except SandrlError as exc:
        print_error(exc.message)
        sys.exit(2)
    except KeyboardInterrupt:
        err_console.print("interrupted", style="bold red")
        sys.exit(130)
