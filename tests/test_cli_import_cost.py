"""What a ``sandrl`` command loads before it reads its arguments: only what its parser needs.

Every command builds the whole parser first (typer builds every sub-command's options to find the
one asked for), so a module a command group imports at its top is a cost every command pays, each
``--help`` and each typo included. The sandbox provider, the wiring, the task loaders, the web
framework and the registry client load inside the commands that use them.
"""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = (
    # third-party: the web framework (through sandrl.http_auth), the HTTP client, the model stack;
    # not pydantic: typer itself coerces a sub-command's option values with it
    "fastapi",
    "starlette",
    "uvicorn",
    "httpx",
    "prometheus_client",
    "yaml",
    "torch",
    "transformers",
    "peft",
    "numpy",
    "matplotlib",
    "ray",
    # sandrl's components: what a command calls, never what its parser needs
    "sandrl.sandbox.bwrap",
    "sandrl.sandbox.remote",
    "sandrl.sandbox.service",
    "sandrl.http_auth",
    "sandrl.images.registry",
    "sandrl.inference",
    "sandrl.tasks",
    "sandrl.rollout",
    "sandrl.wiring",
    "sandrl.train",
    "sandrl.cluster",
    "sandrl.bench",
    "sandrl.demo",
    "sandrl.view",
)
"""Packages (and everything under them) that building and printing the parser must not import."""

HELPS = (
    ["--help"],
    ["images", "--help"],
    ["sandbox", "ls", "--help"],
    ["tasks", "pull", "--help"],
    ["train", "--help"],
)

# In a process of its own: the test process has imported half of sandrl already.
_PROBE = """
import json, sys
from sandrl.cli import main

for args in json.loads(sys.argv[1]):
    sys.argv = ["sandrl", *args]
    try:
        main()
    except SystemExit as stop:
        assert stop.code in (0, None), (args, stop.code)
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


def _loaded(module: str, modules: list[str]) -> list[str]:
    return [m for m in modules if m == module or m.startswith(module + ".")]


def test_a_commands_parser_loads_no_component_and_no_web_or_model_stack() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(HELPS)], capture_output=True, text=True, timeout=60, check=True
    )
    assert "Usage: sandrl [OPTIONS] COMMAND [ARGS]..." in done.stdout
    modules = json.loads(done.stderr.strip().splitlines()[-1])
    loaded = {name: found[:3] for name in HEAVY if (found := _loaded(name, modules))}
    assert loaded == {}, "building the parser imports these; import them inside the commands that use them"
