"""``sandrl sandbox run|ls|rm``: a command in a fresh sandbox, and the live sandboxes of a service.

``run`` uses a local bubblewrap sandbox, or with ``--server`` (or ``$SANDRL_SERVER``) one on a
sandbox service, whose output it streams as it comes. ``ls`` and ``rm`` talk to a service through
:class:`~sandrl.sandbox.client.RemoteProvider`; the library returns data, this module prints it.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import typer

from sandrl.cli.output import emit, err_console
from sandrl.errors import SandboxError, SandboxNotFoundError, SandrlError
from sandrl.sandbox.base import OutputChunk, SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider

if TYPE_CHECKING:
    from sandrl.sandbox.client import RemoteProvider
    from sandrl.sandbox.service.api import SandboxInfo

app = typer.Typer(no_args_is_help=True, help="Run commands in sandboxes.")


@app.command("run", context_settings={"allow_extra_args": True, "ignore_unknown_options": False}, no_args_is_help=True)
def sandbox_run(
    command: list[str] = typer.Argument(..., help="The command and its arguments (after --)."),
    image: str = typer.Option("host", help="Image to start from."),
    cpus: float = typer.Option(SandboxSpec.cpus, help="CPU quota in cores."),
    memory_mb: int = typer.Option(SandboxSpec.memory_mb, help="Memory limit in MiB."),
    pids: int = typer.Option(SandboxSpec.pids, help="Most processes at once."),
    disk_mb: int = typer.Option(SandboxSpec.disk_mb, help="Size of the writable layer in MiB."),
    timeout: float = typer.Option(60.0, help="Wall-clock limit in seconds; exit code 124 when hit."),
    network: bool = typer.Option(
        False, "--network", help="Egress through NAT, not to the host or private ranges (default: loopback only)."
    ),
    server: str | None = typer.Option(None, help="A sandbox service URL (default $SANDRL_SERVER; none: local)."),
    token_file: str | None = typer.Option(None, help="File holding the service's token (default $SANDRL_TOKEN)."),
) -> None:
    """Run COMMAND in a fresh sandbox, print its output, exit with its exit code."""
    if timeout <= 0:
        raise SandrlError("--timeout must be a positive number of seconds")
    spec = SandboxSpec(
        image=image,
        cpus=cpus,
        memory_mb=memory_mb,
        pids=pids,
        disk_mb=disk_mb,
        network=network,
        ttl_s=timeout + 60,
    )
    server = server or os.environ.get("SANDRL_SERVER")
    if server:
        raise typer.Exit(_run_remote(server, shlex.join(command), spec, timeout_s=timeout, token_file=token_file))

    async def go() -> int:
        provider = BwrapProvider()
        async with await provider.create(spec) as sandbox:
            result = await sandbox.exec(shlex.join(command), timeout_s=timeout)
        sys.stdout.write(result.stdout)
        sys.stderr.write(result.stderr)
        if result.timed_out:
            err_console.print(f"[bold red]timed out[/] after {timeout:g} s")
        if result.truncated:
            err_console.print("[yellow]output truncated[/] at the output cap")
        return result.exit_code

    code = asyncio.run(go())
    raise typer.Exit(code if code >= 0 else 128 - code)


def _provider(server: str | None, token_file: str | None) -> RemoteProvider:
    # Imported here: the client brings in httpx and FastAPI, which `sandrl --help` should not wait for.
    from sandrl.sandbox.client import RemoteProvider
    from sandrl.sandbox.service.auth import load_token

    token = load_token(token_file) if token_file else None
    return RemoteProvider(server, token=token)


def _run_remote(
    server: str | None, command: str, spec: SandboxSpec, *, timeout_s: float = 60, token_file: str | None = None
) -> int:
    """Run ``command`` in a fresh sandbox on ``server``, stream its output, return its exit code (as a shell's)."""

    async def go() -> int:
        async with _provider(server, token_file) as provider, await provider.create(spec) as sandbox:
            async for item in sandbox.exec_stream(command, timeout_s=timeout_s):
                if isinstance(item, OutputChunk):
                    out = sys.stdout if item.stream == "stdout" else sys.stderr
                    out.buffer.write(item.data)
                    out.flush()
                else:
                    if item.timed_out:
                        print(f"timed out after {timeout_s:g} s", file=sys.stderr)
                    if item.truncated:
                        print("output truncated at the output cap", file=sys.stderr)
                    return item.exit_code if item.exit_code >= 0 else 128 - item.exit_code
        raise SandboxError("the command's stream ended without an exit status")

    return asyncio.run(go())


def _table(sandboxes: Sequence[SandboxInfo]) -> str:
    """``sandrl sandbox ls`` as a plain table."""
    rows = [("ID", "IMAGE", "CPUS", "MEM_MB", "EXPIRES_IN", "METADATA")]
    now = time.time()
    for s in sandboxes:
        labels = ",".join(f"{k}={v}" for k, v in sorted(s.metadata.items()))
        left = max(0.0, s.expires_at - now)
        rows.append((s.id, s.spec.image, f"{s.spec.cpus:g}", str(s.spec.memory_mb), f"{left:.0f}s", labels))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def _labels(items: list[str]) -> dict[str, str]:
    labels = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SandrlError(f"--metadata takes KEY=VALUE, got {item!r}")
        labels[key] = value
    return labels


@app.command("ls")
def sandbox_ls(
    server: str | None = typer.Option(None, help="The sandbox service URL (default $SANDRL_SERVER)."),
    metadata: list[str] = typer.Option([], help="Only sandboxes with this KEY=VALUE label (repeatable)."),
    token_file: str | None = typer.Option(None, help="File holding the service's token (default $SANDRL_TOKEN)."),
    json_out: bool = typer.Option(False, "--json", help="One JSON object per line."),
) -> None:
    """List the live sandboxes on a sandbox service."""
    labels = _labels(metadata)

    async def go() -> list[SandboxInfo]:
        async with _provider(server, token_file) as provider:
            return await provider.list_sandboxes(labels)

    rows = asyncio.run(go())
    if json_out:
        for row in rows:
            emit(row.model_dump())
    else:
        print(_table(rows))


@app.command("rm")
def sandbox_rm(
    ids: list[str] = typer.Argument(None, help="Sandbox ids to close."),
    server: str | None = typer.Option(None, help="The sandbox service URL (default $SANDRL_SERVER)."),
    all_: bool = typer.Option(False, "--all", help="Close every sandbox (with --metadata: every matching one)."),
    metadata: list[str] = typer.Option([], help="With --all: only sandboxes with this KEY=VALUE label."),
    token_file: str | None = typer.Option(None, help="File holding the service's token (default $SANDRL_TOKEN)."),
) -> None:
    """Close sandboxes on a sandbox service."""
    if not ids and not all_:
        raise SandrlError("give sandbox ids to close, or --all")
    all_matching = _labels(metadata) if all_ else None

    async def go() -> list[str]:
        async with _provider(server, token_file) as provider:
            targets = list(ids or [])
            if all_matching is not None:  # {}: every sandbox
                targets += [s.id for s in await provider.list_sandboxes(all_matching)]
            found = await asyncio.gather(*(provider.kill(i) for i in targets))
        missing = [i for i, ok in zip(targets, found, strict=True) if not ok]
        if missing:
            raise SandboxNotFoundError(f"no such sandbox on the server: {' '.join(missing)} (see `sandrl sandbox ls`)")
        return targets

    closed = asyncio.run(go())
    print(f"closed {len(closed)} sandbox(es)")
