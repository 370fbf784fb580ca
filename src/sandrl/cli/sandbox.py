"""``sandrl sandbox run|ls|gc|rm``: a command in a fresh sandbox; the sandboxes of this host or of a service.

``run`` uses a local bubblewrap sandbox, or with ``--server`` (or ``$SANDRL_SERVER``) one on a
sandbox service, whose output it streams as it comes. ``ls`` lists this host's store (the state
directory, ``$SANDRL_STATE_DIR``: every run's sandboxes there, whose they are and whether they
live, :mod:`sandrl.sandbox.bwrap.inventory`), or with ``--server`` a service's; ``gc`` removes what
dead runs left in the store, after asking; ``rm`` closes a service's sandboxes through
:class:`~sandrl.sandbox.remote.provider.RemoteProvider`. The library returns data, this module prints it.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from sandrl.cli.output import emit, err_console
from sandrl.errors import SandboxError, SandboxNotFoundError, SandboxUnavailableError, SandrlError
from sandrl.sandbox.base import OutputChunk, SandboxSpec

# The store, the provider and the service's client load in the commands that use them: building
# the parser (`sandrl --help`, any command's start) waits for none of them.
if TYPE_CHECKING:
    from sandrl.sandbox.bwrap.cgroups import CgroupManager
    from sandrl.sandbox.bwrap.inventory import StoredSandbox
    from sandrl.sandbox.bwrap.state import StateDir
    from sandrl.sandbox.command import Command
    from sandrl.sandbox.remote.provider import RemoteProvider
    from sandrl.sandbox.remote.wire import SandboxInfo

app = typer.Typer(
    no_args_is_help=True,
    help="Run commands in sandboxes; list and clean up this host's store ($SANDRL_STATE_DIR, default "
    "/var/lib/sandrl) or a sandbox service's sandboxes.",
)


@app.command("run", context_settings={"allow_extra_args": True, "ignore_unknown_options": False}, no_args_is_help=True)
def sandbox_run(
    command: list[str] = typer.Argument(
        ..., help="The program and its arguments (after --), run directly: no shell (sh -c '...' for a shell line)."
    ),
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
        raise typer.Exit(_run_remote(server, command, spec, timeout_s=timeout, token_file=token_file))

    from sandrl.wiring.runner import local_provider

    async def go() -> int:
        provider = local_provider()
        async with await provider.create(spec) as sandbox:
            result = await sandbox.exec(command, timeout_s=timeout)
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
    from sandrl.sandbox.remote.provider import RemoteProvider
    from sandrl.sandbox.service.auth import load_token

    token = load_token(token_file) if token_file else None
    return RemoteProvider(server, token=token)


def _run_remote(
    server: str | None, command: Command, spec: SandboxSpec, *, timeout_s: float = 60, token_file: str | None = None
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
    return _columns(rows)


def _labels(items: list[str]) -> dict[str, str]:
    labels = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SandrlError(f"--metadata takes KEY=VALUE, got {item!r}")
        labels[key] = value
    return labels


STATE_DIR_HELP = "The store's state directory (default $SANDRL_STATE_DIR, else /var/lib/sandrl)."


@app.command("ls")
def sandbox_ls(
    server: str | None = typer.Option(
        None, help="A sandbox service URL (default $SANDRL_SERVER; none: this host's store)."
    ),
    state_dir: Path | None = typer.Option(None, help=STATE_DIR_HELP),
    metadata: list[str] = typer.Option([], help="A service's sandboxes with this KEY=VALUE label (repeatable)."),
    token_file: str | None = typer.Option(None, help="File holding the service's token (default $SANDRL_TOKEN)."),
    json_out: bool = typer.Option(False, "--json", help="One JSON object per line."),
) -> None:
    """List the sandboxes of this host's store, or of a sandbox service with --server.

    The store is the state directory ($SANDRL_STATE_DIR, default /var/lib/sandrl) that every run on
    this host shares unless given its own: each sandbox with its state (live, paused, premade,
    orphaned: alive without the process that made it; dead: what a crashed run left; stray: cgroups
    with no record), its image, age, cgroups and owner (the process that made it, and whether it
    runs). `sandrl sandbox gc` removes what is dead."""
    server = server or (None if state_dir is not None else os.environ.get("SANDRL_SERVER"))
    if server is None:
        if metadata:
            raise SandrlError("--metadata filters a sandbox service's sandboxes: give --server (or $SANDRL_SERVER)")
        root, entries = _survey(state_dir)
        if json_out:
            for entry in entries:
                emit(entry.to_dict())
        else:
            print(_store_report(root, entries))
        return
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


@app.command("gc")
def sandbox_gc(
    state_dir: Path | None = typer.Option(None, help=STATE_DIR_HELP),
    orphans: bool = typer.Option(
        False, "--orphans", help="Also kill sandboxes that live on without the process that made them."
    ),
    yes: bool = typer.Option(False, "--yes", "-y", help="Remove without asking."),
) -> None:
    """Remove what dead runs left in this host's store: their sandboxes' records and cgroups.

    Only sandboxes whose processes are gone and whose owner (the process that made them) is gone
    too, and cgroups with no record; with --orphans also the sandboxes still alive without their
    owner (a paused one whose run crashed). A sandbox whose owner runs is never touched, whoever
    owns it. Lists what it would remove and asks first (--yes: does not ask). The store is the state
    directory, $SANDRL_STATE_DIR (default /var/lib/sandrl)."""
    from sandrl.sandbox.bwrap.inventory import collect, garbage

    root, entries = _survey(state_dir)
    targets = garbage(entries, orphans=orphans)
    kept = [e for e in entries if e not in targets]
    if not targets:
        print(f"nothing to remove under {root}: {_counts(entries) or 'no sandboxes'}")
        return
    print(_store_table(targets))
    if kept:
        print(f"kept: {_counts(kept)}")
    if not yes and not typer.confirm(f"remove these {len(targets)}?", default=False):
        print("nothing removed")
        raise typer.Exit(1)
    state, cgroups = _store(root)
    removed = set(collect(state, cgroups, [e.id for e in targets], orphans=orphans))
    done = Counter(e.state for e in targets if e.id in removed)
    parts = [f"removed {done['dead']} dead sandbox(es)"]
    if done["stray"]:
        parts.append(f"{done['stray']} stray cgroup set(s)")
    if done["orphaned"]:
        parts.append(f"killed {done['orphaned']} orphaned sandbox(es)")
    print(", ".join(parts))


def _store(root: Path) -> tuple[StateDir, CgroupManager]:
    from sandrl.sandbox.bwrap.cgroups import CgroupManager
    from sandrl.sandbox.bwrap.state import StateDir

    state = StateDir(root)
    return state, CgroupManager(subdir=f"sandrl/{state.cgroup_name}")


def _survey(state_dir: Path | None) -> tuple[Path, list[StoredSandbox]]:
    """The store's state directory and its sandboxes; none when it does not exist."""
    import sandrl.sandbox.bwrap.provider
    from sandrl.sandbox.bwrap.inventory import survey

    root = state_dir if state_dir is not None else sandrl.sandbox.bwrap.provider.DEFAULT_STATE_DIR
    if os.geteuid() != 0:
        raise SandboxUnavailableError(f"the sandbox store {root} is root's: run this as root")
    if not root.is_dir():
        return root, []
    return root, survey(*_store(root))


def _counts(entries: Sequence[StoredSandbox]) -> str:
    from sandrl.sandbox.bwrap.inventory import STATES

    by_state = Counter(e.state for e in entries)
    return ", ".join(f"{by_state[s]} {s}" for s in STATES if by_state[s])


def _store_report(root: Path, entries: Sequence[StoredSandbox]) -> str:
    """``sandrl sandbox ls`` of the local store: the table, then what the counts mean to do."""
    from sandrl.sandbox.bwrap.inventory import garbage

    if not entries:
        return f"no sandboxes under {root}"
    lines = [_store_table(entries), "", f"{len(entries)} sandboxes: {_counts(entries)} (under {root})"]
    collectable = garbage(entries)
    if collectable:
        lines.append(f"`sandrl sandbox gc` removes the {len(collectable)} dead or stray")
    orphaned = sum(e.state == "orphaned" for e in entries)
    if orphaned:
        lines.append(f"`sandrl sandbox gc --orphans` also kills the {orphaned} orphaned")
    return "\n".join(lines)


def _store_table(entries: Sequence[StoredSandbox]) -> str:
    rows = [("ID", "STATE", "IMAGE", "AGE", "CGROUPS", "OWNER")]
    now = time.time()
    for e in entries:
        if e.owner_pid is None:
            owner = "-"
        elif e.owner_alive:
            owner = f"pid {e.owner_pid} ({e.owner_command or '?'})"
        else:
            owner = f"pid {e.owner_pid} (gone)"
        age = "-" if e.created is None else _age(now - e.created)
        rows.append((e.id, e.state, e.image or "-", age, str(len(e.cgroups)), owner))
    return _columns(rows)


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{max(0.0, seconds):.0f}s"


def _columns(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


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
