"""Write sandrl's user-facing contract to a folder, one file per piece, to diff across a refactor.

The contract an architecture change must keep byte for byte: the ``--help`` of every command and
sub-command, and the OpenAPI documents (or, for apps that serve none, the route tables) of every
HTTP server. Run it before and after, then ``diff -r before after``:

    .venv/bin/python scripts/contract_snapshot.py /tmp/contract-before
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer
from typer.testing import CliRunner


def _commands(group: Any, path: tuple[str, ...]) -> list[tuple[str, ...]]:
    found = [path]
    # typer vendors click in recent releases: a group is whatever has sub-commands.
    for name in sorted(getattr(group, "commands", None) or {}):
        found += _commands(group.commands[name], (*path, name))
    return found


def _helps(out: Path) -> int:
    from sandrl.cli import app

    command = typer.main.get_command(app)
    runner = CliRunner()
    paths = _commands(command, ())
    for path in paths:
        result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "100", "TERM": "dumb"})
        name = "_".join(("sandrl", *path)) + ".txt"
        (out / "help" / name).write_text(f"exit {result.exit_code}\n{result.output}")
    return len(paths)


def _routes(app: Any) -> list[str]:
    rows = []
    for route in app.routes:
        methods = ",".join(sorted(getattr(route, "methods", None) or ["WS"]))
        rows.append(f"{methods} {route.path} {getattr(route, 'name', '')}")
    return sorted(rows)


class _NoProvider:
    async def create(self, spec: Any) -> Any:
        raise AssertionError("only the OpenAPI document is read")


def _apis(out: Path) -> None:
    from sandrl.sandbox.service.server import create_app as service_app
    from sandrl.sandbox.service.state import SandboxService

    app = service_app(SandboxService(_NoProvider()), token="t")  # type: ignore[arg-type]
    (out / "api" / "sandbox-service.openapi.json").write_text(json.dumps(app.openapi(), indent=1, sort_keys=True))
    from sandrl.inference import server

    routers = {n: getattr(server, n) for n in dir(server) if n.endswith("router")}
    for name, router in sorted(routers.items()):
        (out / "api" / f"inference.{name}.routes.txt").write_text("\n".join(_routes(router)) + "\n")
    from sandrl.view.app import create_app as view_app

    try:
        view = view_app(Path("/nonexistent-run-dir"))  # type: ignore[call-arg]
        (out / "api" / "view.routes.txt").write_text("\n".join(_routes(view)) + "\n")
    except Exception as e:  # the snapshot says what it could not read
        (out / "api" / "view.routes.txt").write_text(f"not read: {e!r}\n")


def main() -> None:
    out = Path(sys.argv[1])
    (out / "help").mkdir(parents=True, exist_ok=True)
    (out / "api").mkdir(parents=True, exist_ok=True)
    n = _helps(out)
    _apis(out)
    print(f"{n} help pages and the API documents written to {out}")


if __name__ == "__main__":
    main()
