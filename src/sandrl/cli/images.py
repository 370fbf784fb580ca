"""``sandrl images build|pull|prefetch|import|ls|prune|rm``: the environment images in the local store.

``images build`` runs a Dockerfile through :class:`~sandrl.sandbox.bwrap.dockerfile.builder.ImageBuilder`, or makes
the Debian base image with debootstrap (``sandrl images build debian``, :mod:`sandrl.images.debian`);
``images pull`` fetches a registry image (:mod:`sandrl.sandbox.bwrap.pulled`); ``images prefetch`` fetches every
image a task set needs (:mod:`sandrl.rollout.prefetch`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.markup import escape
from rich.table import Table

from sandrl.cli.output import SWEBENCH_IMAGES_HELP, emit, rich_console
from sandrl.errors import ConfigError
from sandrl.fetch_limits import PREFETCH_JOBS
from sandrl.images.debian import DEBIAN_IMAGE, DEBIAN_MIRROR, DEBIAN_SUITE

# The store, the builder, the registry client and the wiring load in the commands that use them:
# building the parser (`sandrl --help`, any command's start) waits for none of them.
if TYPE_CHECKING:
    from rich.console import Console

    from sandrl.images.pull import PullEvent
    from sandrl.rollout.prefetch import PrefetchReport
    from sandrl.sandbox.bwrap import BwrapProvider
    from sandrl.sandbox.bwrap.dockerfile.builder import StepEvent
    from sandrl.sandbox.bwrap.images import ImageStore
    from sandrl.sandbox.bwrap.prune import PrunePlan
    from sandrl.tasks.task import Task

app = typer.Typer(
    no_args_is_help=True,
    help="Environment images in this host's store ($SANDRL_STATE_DIR, default /var/lib/sandrl): build, pull, "
    "import, ls, prune, rm.",
)


def _store() -> ImageStore:
    """The default provider's image store, without starting a provider (no helper, no cgroups)."""
    import sandrl.sandbox.bwrap.provider
    from sandrl.sandbox.bwrap.images import ImageStore

    return ImageStore(sandrl.sandbox.bwrap.provider.DEFAULT_STATE_DIR / "images")


@app.command("build")
def images_build(
    name: str = typer.Argument(..., help="The image's name; 'debian' with no --file makes Debian with debootstrap."),
    file: Path | None = typer.Option(None, "--file", "-f", help="The Dockerfile to build."),
    context: Path | None = typer.Option(None, help="The build context (default: the Dockerfile's directory)."),
    build_arg: list[str] = typer.Option([], "--build-arg", help="NAME=value for an ARG; repeatable."),
    network: bool = typer.Option(True, "--network/--no-network", help="Give RUN steps the network (as Docker)."),
    timeout: float = typer.Option(600.0, help="The whole build's time limit in seconds."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Rebuild every step."),
    suite: str = typer.Option(DEBIAN_SUITE, help="Debian suite for debootstrap."),
    mirror: str = typer.Option(DEBIAN_MIRROR, help="Debian mirror for debootstrap."),
) -> None:
    """Build NAME from a Dockerfile (--file), or the Debian base image (`sandrl images build debian`)."""
    from sandrl.sandbox.bwrap.dockerfile.builder import BuildOptions, ImageBuilder
    from sandrl.wiring.runner import local_provider

    console = rich_console(stderr=False)
    provider = local_provider()
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
                f"[bold]step {event.index}/{event.total}[/] {escape(event.instruction.text[:100])} "
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
            f"built [bold]{escape(result.image)}[/]: {result.steps} steps, {result.cached} cached, "
            f"{result.built} built, in {result.duration_s:.1f} s"
        )

    asyncio.run(go())


def _build_debian(provider: BwrapProvider, suite: str, mirror: str, console: Console) -> None:
    from sandrl.images.debian import build_debian
    from sandrl.images.manifest import DEFAULT_PATH

    store = provider.images
    if store.exists(DEBIAN_IMAGE):
        console.print(f"the image {DEBIAN_IMAGE!r} exists; remove it first to rebuild (sandrl images rm debian)")
        return
    start = time.monotonic()
    with console.status(f"debootstrap --variant=minbase {suite} (downloads ~40 MB)"):
        build_debian(store, {"PATH": DEFAULT_PATH}, suite=suite, mirror=mirror)
    console.print(f"built [bold]{DEBIAN_IMAGE}[/] (Debian {suite} minbase) in {time.monotonic() - start:.0f} s")


@app.command("pull")
def images_pull(
    reference: str = typer.Argument(..., help="name[:tag][@digest], e.g. ubuntu:24.04 or ghcr.io/org/img@sha256:..."),
    platform: str | None = typer.Option(
        None, help="os/arch[/variant] of an index, e.g. linux/arm64 (default: this host)."
    ),
) -> None:
    """Pull an image from its registry (or a mirror: SANDRL_REGISTRY_MIRRORS); print its name and digest."""
    from rich.progress import BarColumn, DownloadColumn, TaskID, TextColumn, TransferSpeedColumn

    from sandrl.images.manifest import Platform
    from sandrl.progress import Progress
    from sandrl.sandbox.bwrap.pulled import pull_into_store

    store = _store()
    wanted = Platform.parse(platform) if platform else None
    console = rich_console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=console,
        transient=False,
    ) as progress:
        tasks: dict[str, TaskID] = {}

        def show(event: PullEvent) -> None:
            short = event.digest.split(":")[-1][:12]
            if event.kind == "layer-start":
                tasks[event.digest] = progress.add_task(f"layer {short}", total=event.size, unit="bytes")
            elif event.kind == "bytes" and event.digest in tasks:
                progress.advance(tasks[event.digest], event.size)
            elif event.kind == "layer-unpacking" and event.digest in tasks:
                progress.update(tasks[event.digest], description=f"layer {short} unpacking")
            elif event.kind == "layer-done" and event.digest in tasks:
                progress.update(tasks[event.digest], description=f"layer {short} done")
            elif event.kind == "layer-cached":
                progress.add_task(f"layer {short} (have it)", total=event.size, completed=event.size)

        name = asyncio.run(pull_into_store(store, reference, platform=wanted, refresh=True, on_event=show))
    config = store.meta(name).get("config")
    digest = config.get("digest") if isinstance(config, dict) else None
    emit({"image": name, "reference": reference, "digest": digest})


def prefetch_tasks(
    tasks: Sequence[Task],
    *,
    jobs: int = PREFETCH_JOBS,
    max_store_gb: float | None = None,
    console: Console | None = None,
) -> PrefetchReport:
    """Every image ``tasks`` need, pulled or built into this host's store, ``jobs`` at a time, with a
    progress bar and the report printed on ``console`` (stderr by default); ``max_store_gb`` stops
    fetching more once the store takes that much. ``sandrl images prefetch`` and ``sandrl tasks
    pull --images`` both run this; the caller emits ``report.to_dict()`` and says a failure."""
    from sandrl.rollout.images import TaskImages
    from sandrl.rollout.prefetch import prefetch_images, print_report
    from sandrl.wiring.runner import local_provider

    if jobs < 1:
        raise ConfigError(f"--jobs must be at least 1, got {jobs}")
    if max_store_gb is not None and not max_store_gb > 0:
        raise ConfigError(f"--max-store-gb must be a positive number of GB, got {max_store_gb}")
    bound = round(max_store_gb * 1e9) if max_store_gb is not None else None
    console = console or rich_console(stderr=True)

    async def go() -> PrefetchReport:
        provider = local_provider()
        try:
            images = TaskImages(provider)
            return await prefetch_images(
                images, tasks, jobs=jobs, max_store_bytes=bound, progress=True, console=console
            )
        finally:
            await provider.close_all()

    report = asyncio.run(go())
    print_report(report, console)
    return report


@app.command("prefetch")
def images_prefetch(
    tasks: str = typer.Argument(..., help="A task directory, a directory of them, a SWE-bench file, or 'builtin'."),
    jobs: int = typer.Option(PREFETCH_JOBS, "--jobs", "-j", help="Images pulled or built at once."),
    max_store_gb: float | None = typer.Option(
        None,
        "--max-store-gb",
        help="Fetch no more once the image store takes this many GB (the images in flight finish; "
        "nothing is deleted); unset: no bound.",
    ),
    swebench_images: str | None = typer.Option(None, help=SWEBENCH_IMAGES_HELP),
    json_only: bool = typer.Option(False, "--json", help="Print only the JSON line."),
) -> None:
    """Pull or build every task's image into this host's store before a run; exit 1 if any failed.

    Each distinct image once, in the tasks' order, --jobs at a time, with a progress bar; then the
    images pulled, cached, built, failed (with the reason) or skipped at --max-store-gb, and the
    store's disk use. Ends with one JSON line."""
    from sandrl.wiring.tasks import load_task_set

    loaded = load_task_set(tasks, swebench_images=swebench_images)
    report = prefetch_tasks(loaded, jobs=jobs, max_store_gb=max_store_gb, console=rich_console(quiet=json_only))
    emit({"tasks": tasks, **report.to_dict()})
    if report.count("failed"):
        raise typer.Exit(1)


@app.command("import")
def images_import(
    rootfs: Path = typer.Argument(..., help="A tar archive of a root filesystem (docker export; gzip/zstd too)."),
    name: str = typer.Argument(..., help="The image's name in the store."),
) -> None:
    """Import a root filesystem archive as an image."""
    from sandrl.sandbox.bwrap.pulled import import_rootfs_tar

    store = _store()
    with rich_console(stderr=True).status(f"unpacking {rootfs}"):
        import_rootfs_tar(store, rootfs, name)
    emit({"image": name, "source": str(rootfs)})


@app.command("ls")
def images_ls(
    all_images: bool = typer.Option(False, "--all", "-a", help="Also the builder's cache images (build-*)."),
) -> None:
    """List the images in the store, with where each came from."""
    from sandrl.sandbox.bwrap.dockerfile.names import BUILD_PREFIX
    from sandrl.sandbox.bwrap.images import HOST_IMAGE

    console = rich_console(stderr=False)
    store = _store()
    table = Table("image", "source", "digest", "layers", "created")
    for name in store.names():
        if name.startswith(BUILD_PREFIX) and not all_images:
            continue
        meta = store.meta(name)
        layers = meta.get("layers")
        created = meta.get("created")
        when = (
            time.strftime("%Y-%m-%d %H:%M", time.localtime(float(created))) if isinstance(created, int | float) else "-"
        )
        config = meta.get("config")
        config = config if isinstance(config, dict) else {}
        base = meta.get("base")
        if name == HOST_IMAGE:
            source = "(host system)"
        elif config.get("source"):
            source = str(config["source"])
        elif config.get("task"):
            source = f"task {config['task']}"
        elif config.get("step") or config.get("key"):
            source = f"built{f' on {base}' if base else ''}"
        else:
            source = f"{base}" if base else "-"
        digest = str(config.get("digest") or "-")
        table.add_row(
            escape(name),
            escape(source),
            digest[:19] + "..." if len(digest) > 22 else digest,
            str(len(layers)) if isinstance(layers, list) else "-",
            when,
        )
    console.print(table)
    hidden = sum(n.startswith(BUILD_PREFIX) for n in store.names())
    if hidden and not all_images:
        console.print(
            f"[dim]{hidden} cache images (build-*) not shown; --all shows them; `sandrl images prune` removes them[/]"
        )


@app.command("prune")
def images_prune(
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would go; remove nothing."),
    keep_cache: bool = typer.Option(False, "--keep-cache", help="Keep the builder's cache images (build-*)."),
    keep_tasks: bool = typer.Option(False, "--keep-tasks", help="Keep tasks' images (task-<task>-<hash>)."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Remove without asking."),
) -> None:
    """Remove tasks' images, the builder's cache images and every layer no image uses.

    Says how many of each kind and how much each frees, then asks (--yes: does not ask). Images a
    live sandbox uses are kept. Ends with one JSON line."""
    from sandrl.sandbox.bwrap.prune import apply_prune, plan_prune
    from sandrl.wiring.runner import local_provider

    provider = local_provider()
    plan = plan_prune(provider.images, provider.state, build_cache=not keep_cache, tasks=not keep_tasks)
    console = rich_console(stderr=False)
    if not plan:
        console.print("nothing to prune")
    else:
        console.print(_prune_table(plan))
        names = _task_images(plan)
        if names is not None:
            console.print(names, markup=False, highlight=False)
        if not dry_run and not yes and not typer.confirm(f"remove them ({_size(plan.bytes)})?", default=False):
            console.print("nothing removed")
            raise typer.Exit(1)
    if plan and not dry_run:
        apply_prune(provider.images, plan)
    counts = {kind.name: len(kind.names) for kind in plan.kinds}
    emit(
        {
            "dry_run": dry_run,
            "images": len(plan.images),
            "task_images": counts.get("task images", 0),
            "cache_images": counts.get("build cache images", 0),
            "fork_images": counts.get("fork images", 0),
            "layers": len(plan.layers),
            "leftovers": len(plan.leftovers),
            "freed_mb": round(plan.bytes / 2**20, 1),
        }
    )


_LISTED_TASK_IMAGES = 20
"""How many task images a prune names before it says how many more."""


def _prune_table(plan: PrunePlan) -> Table:
    table = Table("what", "count", "frees", title="sandrl images prune would remove", title_justify="left")
    for kind in plan.kinds:
        if kind.names:
            table.add_row(kind.name, str(len(kind.names)), _size(kind.bytes))
    table.add_row("total", "", _size(plan.bytes))
    return table


def _task_images(plan: PrunePlan) -> str | None:
    """The task images a prune removes, by name (the first :data:`_LISTED_TASK_IMAGES`)."""
    tasks = next((k.names for k in plan.kinds if k.name == "task images"), ())
    if not tasks:
        return None
    more = f" and {len(tasks) - _LISTED_TASK_IMAGES} more" if len(tasks) > _LISTED_TASK_IMAGES else ""
    return f"task images: {' '.join(tasks[:_LISTED_TASK_IMAGES])}{more}"


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


@app.command("rm")
def images_rm(
    names: list[str] = typer.Argument(None, help="Images to remove."),
    cache: bool = typer.Option(False, "--cache", help="Remove every build cache image (build-*)."),
    prune: bool = typer.Option(True, help="Delete layers no image uses any more (live sandboxes' are kept)."),
) -> None:
    """Remove images; their layers go too when no image uses them."""
    from sandrl.sandbox.bwrap.dockerfile.names import BUILD_PREFIX
    from sandrl.sandbox.bwrap.prune import apply_prune, plan_prune
    from sandrl.wiring.runner import local_provider

    console = rich_console(stderr=False)
    provider = local_provider()
    store = provider.images
    targets = list(names or [])
    if cache:
        targets += [n for n in store.names() if n.startswith(BUILD_PREFIX)]
    if not targets:
        raise ConfigError("name the images to remove, or give --cache")
    for name in targets:
        store.remove(name)
    removed = 0
    if prune:
        plan = plan_prune(store, provider.state, build_cache=False, tasks=False)
        apply_prune(store, plan)
        removed = len(plan.layers)
    console.print(f"removed {len(targets)} images and {removed} unused layers")


@app.command("templates")
def images_templates(
    tasks: str = typer.Argument(..., help="A task directory, a directory of them, or 'builtin'."),
    build: bool = typer.Option(False, "--build", help="Build each missing template into this host's store."),
    state_dir: Path | None = typer.Option(
        None,
        help="The store's state directory (default: `sandrl serve sandboxes`'s, $SANDRL_STATE_DIR, "
        "else /var/lib/sandrl).",
    ),
) -> None:
    """The E2B template of each task (what `--sandboxes e2b` starts it from); --build makes them on this sandrl host.

    Run it on the host that serves the E2B API (`sandrl serve sandboxes`), with its state directory:
    the service then has every template the tasks name. Ends with one JSON line."""
    import sandrl.sandbox.bwrap.provider
    from sandrl.sandbox.bwrap.images import ImageStore
    from sandrl.sandbox.e2b.templates import BASE_TEMPLATE, build_template, template_for
    from sandrl.wiring.runner import local_provider
    from sandrl.wiring.tasks import load_task_set

    console = rich_console(stderr=False)
    loaded = load_task_set(tasks)
    root = Path(state_dir) if state_dir is not None else sandrl.sandbox.bwrap.provider.DEFAULT_STATE_DIR
    store = ImageStore(root / "images")
    names = {task.id: template_for(task.image_source()) for task in loaded}
    built: list[str] = []

    async def go() -> None:
        provider = local_provider(root)
        try:
            for task in loaded:
                name = names[task.id]
                if name != BASE_TEMPLATE and not store.exists(name):
                    await build_template(provider, task.image_source())
                    built.append(name)
        finally:
            await provider.close_all()

    if build:
        asyncio.run(go())
    missing = sorted({n for n in names.values() if n != BASE_TEMPLATE and not store.exists(n)})
    table = Table("task", "template", "on this host")
    for task_id, name in names.items():
        state = "built now" if name in built else "missing" if name in missing else "present"
        table.add_row(escape(task_id), escape(name), state)
    console.print(table)
    if missing:
        console.print(
            f"{len(missing)} template(s) missing here: `sandrl images templates {escape(tasks)} --build` makes them"
        )
    emit({"templates": names, "built": sorted(set(built)), "missing": missing})
