"""``sandrl tasks ...`` and ``sandrl images ...``: task sets and environment images from the command line.

Mounted by :mod:`sandrl.cli` as ``app.add_typer(tasks_app, name="tasks")`` and
``app.add_typer(images_app, name="images")``. Errors are raised as
:class:`~sandrl.errors.SandrlError` and printed as one line by ``sandrl``'s ``main()``.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sandrl.errors import ConfigError, ImageBuildError
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.sandbox.bwrap.dockerfile.builder import BUILD_PREFIX, BuildOptions, ImageBuilder, StepEvent
from sandrl.sandbox.bwrap.images import DEFAULT_PATH, HOST_IMAGE
from sandrl.tasks.loader import TaskProblem, load_tasks
from sandrl.tasks.suite import AgentKind, TaskRun, TaskValidation, run_many, run_task, validate_task
from sandrl.tasks.task import Task

tasks_app = typer.Typer(no_args_is_help=True, help="Task sets: list, validate, run with the oracle or a null agent.")
images_app = typer.Typer(no_args_is_help=True, help="Environment images: build (Dockerfile or debian), ls, rm.")

DEBIAN_IMAGE = "debian"
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"


def _console(json_only: bool = False) -> Console:
    return Console(file=io.StringIO()) if json_only else Console(stderr=False)


def _load(path: Path, console: Console) -> tuple[list[Task], list[TaskProblem]]:
    tasks, problems = load_tasks(path)
    for problem in problems:
        console.print(f"[red]problem[/] {problem.path}: {problem.problem}", highlight=False, soft_wrap=True)
    if not tasks and not problems:
        raise ConfigError(f"no tasks under {path}; give a task directory or a directory of them")
    return tasks, problems


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


@tasks_app.command("list")
def tasks_list(
    path: Path = typer.Argument(..., help="A task directory, a directory of them, or a SWE-bench file."),
) -> None:
    """List the tasks under PATH, and the ones that do not load."""
    console = _console()
    tasks, problems = _load(path, console)
    table = Table("task", "format", "base image", "workdir", "agent s", "verifier s", "solution")
    for task in tasks:
        table.add_row(
            task.id,
            task.format,
            task.environment.base_image or "-",
            task.environment.workdir,
            f"{task.agent_timeout_s:g}",
            f"{task.verifier.timeout_s:g}",
            "yes" if task.solution is not None else "no",
        )
    console.print(table)
    console.print(f"{len(tasks)} tasks, {len(problems)} problems")
    if problems:
        raise typer.Exit(1)


@tasks_app.command("validate")
def tasks_validate(
    path: Path = typer.Argument(..., help="A task directory or a directory of them."),
    concurrency: int = typer.Option(2, help="Tasks validated at once (each uses two sandboxes)."),
) -> None:
    """For every task: the environment builds, the tests fail without the solution and pass with it."""
    if concurrency < 1:
        raise ConfigError("--concurrency must be at least 1")
    console = _console()
    tasks, problems = _load(path, console)
    start = time.monotonic()

    async def go() -> list[TaskValidation]:
        provider = BwrapProvider()
        try:
            with _progress(console) as progress:
                bar = progress.add_task("validating", total=len(tasks))

                def done(task: Task, result: TaskValidation) -> None:
                    progress.advance(bar)
                    if not result.ok:
                        progress.console.print(f"[red]FAIL[/] {task.id}: {result.problem}", highlight=False)

                return await run_many(
                    tasks, lambda t: validate_task(t, provider), concurrency=concurrency, on_done=done
                )
        finally:
            await provider.close_all()

    results = asyncio.run(go())
    table = Table("task", "built", "reward untouched", "reward with oracle", "s", "result")
    for r in results:
        table.add_row(
            r.task_id,
            "yes" if r.built else "no",
            "-" if r.reward_without is None else f"{r.reward_without:g}",
            "-" if r.reward_with is None else f"{r.reward_with:g}",
            f"{r.duration_s:.1f}",
            "[green]ok[/]" if r.ok else "[red]FAIL[/]",
        )
    console.print(table)
    failed = [r for r in results if not r.ok]
    console.print(
        f"{len(results) - len(failed)}/{len(results)} tasks valid, {len(failed)} failed, "
        f"{len(problems)} did not load, in {time.monotonic() - start:.1f} s"
    )
    if failed or problems:
        raise typer.Exit(1)


@tasks_app.command("run")
def tasks_run(
    path: Path = typer.Argument(..., help="A task directory or a directory of them."),
    agent: str = typer.Option("oracle", help="oracle (the reference solution) or null (does nothing)."),
    concurrency: int = typer.Option(2, help="Tasks run at once."),
    json_out: bool = typer.Option(False, "--json", help="End with one JSON line of the results."),
) -> None:
    """Run every task with the oracle or the null agent through the real verifier; print the pass rate."""
    if agent not in ("oracle", "null"):
        raise ConfigError(f"--agent must be oracle or null, got {agent!r}")
    if concurrency < 1:
        raise ConfigError("--concurrency must be at least 1")
    kind: AgentKind = "oracle" if agent == "oracle" else "null"
    console = Console(stderr=True) if json_out else _console()
    tasks, problems = _load(path, console)
    start = time.monotonic()

    async def go() -> list[TaskRun]:
        provider = BwrapProvider()
        try:
            with _progress(console) as progress:
                bar = progress.add_task(f"{agent} agent", total=len(tasks))

                def done(task: Task, result: TaskRun) -> None:
                    progress.advance(bar)
                    if result.error is not None:
                        progress.console.print(f"[yellow]error[/] {task.id}: {result.error}", highlight=False)

                return await run_many(
                    tasks, lambda t: run_task(t, provider, kind), concurrency=concurrency, on_done=done
                )
        finally:
            await provider.close_all()

    results = asyncio.run(go())
    elapsed = time.monotonic() - start
    table = Table("task", "reward", "passed", "build s", "total s", "error")
    for r in results:
        table.add_row(
            r.task_id,
            f"{r.reward:g}",
            "yes" if r.passed else "no",
            f"{r.build_s:.2f}",
            f"{r.duration_s:.1f}",
            (r.error or "")[:80],
        )
    console.print(table)
    passed = sum(r.passed for r in results)
    errors = sum(r.error is not None for r in results)
    rate = passed / len(results) if results else 0.0
    mean = sum(r.reward for r in results) / len(results) if results else 0.0
    console.print(
        f"{agent}: {passed}/{len(results)} passed (pass rate {rate:.3f}, mean reward {mean:.3f}), "
        f"{errors} errors, {len(problems)} did not load, in {elapsed:.1f} s"
    )
    if json_out:
        summary = {
            "agent": agent,
            "tasks": len(results),
            "passed": passed,
            "pass_rate": rate,
            "mean_reward": mean,
            "errors": errors,
            "problems": len(problems),
            "seconds": round(elapsed, 2),
            "results": [r.to_dict() for r in results],
        }
        print(json.dumps(summary))
    if errors or problems:
        raise typer.Exit(1)


# -- images


@images_app.command("build")
def images_build(
    name: str = typer.Argument(..., help="The image's name; 'debian' with no --file makes Debian with debootstrap."),
    file: Path | None = typer.Option(None, "--file", "-f", help="The Dockerfile to build."),
    context: Path | None = typer.Option(None, help="The build context (default: the Dockerfile's directory)."),
    build_arg: list[str] = typer.Option([], "--build-arg", help="NAME=value for an ARG; repeatable."),
    network: bool = typer.Option(False, "--network", help="Give RUN steps the host's network."),
    timeout: float = typer.Option(600.0, help="The whole build's time limit in seconds."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Rebuild every step."),
    suite: str = typer.Option(DEBIAN_SUITE, help="Debian suite for debootstrap."),
    mirror: str = typer.Option(DEBIAN_MIRROR, help="Debian mirror for debootstrap."),
) -> None:
    """Build NAME from a Dockerfile (--file), or the Debian base image (`sandrl images build debian`)."""
    console = _console()
    provider = BwrapProvider()
    if file is None:
        if name != DEBIAN_IMAGE:
            raise ConfigError(f"give the Dockerfile to build {name!r} with --file (only 'debian' is built without one)")
        _build_debian(provider, suite, mirror, console)
        return
    args: dict[str, str] = {}
    for item in build_arg:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--build-arg must be NAME=value, got {item!r}")
        args[key] = value
    options = BuildOptions(timeout_s=timeout, network=network, build_args=args, use_cache=not no_cache)

    def show(event: StepEvent) -> None:
        if event.phase == "done":
            console.print(
                f"[bold]step {event.index}/{event.total}[/] {event.instruction.text[:100]} "
                f"[dim]{event.status} {event.duration_s:.2f} s[/]",
                highlight=False,
            )

    async def go() -> None:
        try:
            builder = ImageBuilder(provider, on_event=show)
            result = await builder.build(file, context=context, options=options, tag=name)
        finally:
            await provider.close_all()
        console.print(
            f"built [bold]{result.image}[/]: {result.steps} steps, {result.cached} cached, "
            f"{result.built} built, in {result.duration_s:.1f} s"
        )

    asyncio.run(go())


def _build_debian(provider: BwrapProvider, suite: str, mirror: str, console: Console) -> None:
    store = provider.images
    if store.exists(DEBIAN_IMAGE):
        console.print(f"the image {DEBIAN_IMAGE!r} exists; remove it first to rebuild (sandrl images rm debian)")
        return
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None:
        raise ImageBuildError("debootstrap is not installed: apt-get install debootstrap, then run this again")
    work = store.root / "layers"
    work.mkdir(parents=True, exist_ok=True)
    target = Path(tempfile.mkdtemp(prefix=".debootstrap-", dir=work))
    start = time.monotonic()
    try:
        with console.status(f"debootstrap --variant=minbase {suite} (downloads ~40 MB)"):
            proc = subprocess.run(
                [debootstrap, "--variant=minbase", suite, str(target), mirror],
                capture_output=True,
                text=True,
                timeout=1800,
                check=False,
            )
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
            raise ImageBuildError(
                f"debootstrap failed with exit code {proc.returncode} (is the mirror reachable?):\n{tail}"
            )
        os.chmod(target, 0o755)  # mkdtemp made it 0700: the image's / must be open to every user
        for scratch in ("var/cache/apt/archives", "var/lib/apt/lists"):
            path = target / scratch
            if path.is_dir():
                for item in path.iterdir():
                    if item.is_file():
                        item.unlink()
        store.add_rootfs(DEBIAN_IMAGE, target, move=True, env={"PATH": DEFAULT_PATH}, workdir="/")
    finally:
        shutil.rmtree(target, ignore_errors=True)
    console.print(f"built [bold]{DEBIAN_IMAGE}[/] (Debian {suite} minbase) in {time.monotonic() - start:.0f} s")


@images_app.command("ls")
def images_ls(
    all_images: bool = typer.Option(False, "--all", "-a", help="Also the builder's cache images (build-*)."),
) -> None:
    """List the images in the store."""
    console = _console()
    store = BwrapProvider().images
    table = Table("image", "base", "layers", "created")
    shown = 0
    for name in store.names():
        if name.startswith(BUILD_PREFIX) and not all_images:
            continue
        meta = store.meta(name)
        layers = meta.get("layers")
        created = meta.get("created")
        when = (
            time.strftime("%Y-%m-%d %H:%M", time.localtime(float(created))) if isinstance(created, int | float) else "-"
        )
        base = meta.get("base")
        table.add_row(
            name,
            str(base) if base else ("(host system)" if name == HOST_IMAGE else "-"),
            str(len(layers)) if isinstance(layers, list) else "-",
            when,
        )
        shown += 1
    console.print(table)
    hidden = sum(n.startswith(BUILD_PREFIX) for n in store.names())
    if hidden and not all_images:
        console.print(f"[dim]{hidden} cache images (build-*) not shown; --all shows them[/]")


@images_app.command("rm")
def images_rm(
    names: list[str] = typer.Argument(None, help="Images to remove."),
    cache: bool = typer.Option(False, "--cache", help="Remove every build cache image (build-*)."),
    prune: bool = typer.Option(True, help="Delete layers no image uses any more (do not run while sandboxes do)."),
) -> None:
    """Remove images; their layers go too when no image uses them."""
    console = _console()
    store = BwrapProvider().images
    targets = list(names or [])
    if cache:
        targets += [n for n in store.names() if n.startswith(BUILD_PREFIX)]
    if not targets:
        raise ConfigError("name the images to remove, or give --cache")
    for name in targets:
        store.remove(name)
    removed = store.prune_layers() if prune else []
    console.print(f"removed {len(targets)} images and {len(removed)} unused layers")
