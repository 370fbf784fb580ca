"""``sandrl tasks list|validate|run|pull``: task sets from the command line.

Errors are raised as :class:`~sandrl.errors.SandrlError` and printed as one line by
``sandrl``'s ``main()``.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.markup import escape
from rich.table import Table

from sandrl.cli.images import prefetch_tasks
from sandrl.cli.output import SWEBENCH_IMAGES_HELP, emit, print_error, rich_console, sandboxes_help
from sandrl.errors import ConfigError
from sandrl.fetch_limits import DATASET_GIT_TIMEOUT_S, DATASET_JOBS

# The loaders, the wiring and the dataset client load in the commands that use them: building the
# parser (`sandrl --help`, any command's start) waits for none of them.
if TYPE_CHECKING:
    from rich.console import Console

    from sandrl.tasks.datasets.pull import TaskOutcome
    from sandrl.tasks.loader import TaskProblem
    from sandrl.tasks.task import Task
    from sandrl.wiring.config import RolloutConfig
    from sandrl.wiring.suite import AgentKind, TaskRun, TaskValidation


def _shown(text: object) -> str:
    """Outside text (a task's id, what its verifier or Dockerfile printed) as it is, in one bounded
    line: never read as markup, never a terminal escape."""
    from sandrl.wiring.eval_report import shown_text

    return escape(shown_text(str(text)))


app = typer.Typer(
    no_args_is_help=True, help="Task sets: list, validate, run with the oracle or a null agent, pull from a registry."
)


def _load(spec: str, console: Console, swebench_images: str | None) -> tuple[list[Task], list[TaskProblem]]:
    from sandrl.tasks.loader import load_tasks
    from sandrl.tasks.swebench_specs import images_setting
    from sandrl.wiring.tasks import task_path

    try:
        images_setting(swebench_images)
    except ValueError as exc:
        raise ConfigError(f"--swebench-images: {exc}") from exc
    path = task_path(spec)
    tasks, problems = load_tasks(path, swebench_images=swebench_images)
    for problem in problems:
        console.print(
            f"[red]problem[/] {_shown(problem.path)}: {_shown(problem.problem)}", highlight=False, soft_wrap=True
        )
    if not tasks and not problems:
        raise ConfigError(f"no tasks under {path}; give a task directory, a directory of them, or 'builtin'")
    return tasks, problems


def _sandboxes(sandboxes: str | None) -> RolloutConfig:
    """Where the tasks' sandboxes run: ``--sandboxes``, checked as ``sandrl eval`` checks it."""
    from sandrl.wiring.config import RolloutConfig

    return RolloutConfig(sandboxes=sandboxes or "local")


@app.command("list")
def tasks_list(
    path: str = typer.Argument(..., help="A task directory, a directory of them, a SWE-bench file, or 'builtin'."),
    swebench_images: str | None = typer.Option(None, help=SWEBENCH_IMAGES_HELP),
) -> None:
    """List the tasks under PATH, and the ones that do not load."""
    console = rich_console(stderr=False)
    tasks, problems = _load(path, console, swebench_images)
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


@app.command("validate")
def tasks_validate(
    path: str = typer.Argument(..., help="A task directory, a directory of them, or 'builtin' (the shipped suite)."),
    concurrency: int = typer.Option(2, help="Tasks validated at once (each uses two sandboxes)."),
    swebench_images: str | None = typer.Option(None, help=SWEBENCH_IMAGES_HELP),
    sandboxes: str | None = typer.Option(None, help=sandboxes_help("local")),
) -> None:
    """For every task: the environment builds, the tests fail without the solution and pass with it."""
    from sandrl.progress import Progress
    from sandrl.wiring.sandboxes import open_provider
    from sandrl.wiring.suite import validate_suite

    if concurrency < 1:
        raise ConfigError("--concurrency must be at least 1")
    rollout = _sandboxes(sandboxes)
    console = rich_console(stderr=False)
    tasks, problems = _load(path, console, swebench_images)
    start = time.monotonic()

    async def go() -> list[TaskValidation]:
        async with open_provider(rollout) as provider:
            with Progress(console=console) as progress:
                bar = progress.add_task("validating", total=len(tasks))

                def done(task: Task, result: TaskValidation) -> None:
                    progress.advance(bar)
                    if not result.ok:
                        progress.console.print(
                            f"[red]FAIL[/] {_shown(task.id)}: {_shown(result.problem)}", highlight=False
                        )

                return await validate_suite(tasks, provider, concurrency=concurrency, on_done=done)

    results = asyncio.run(go())
    table = Table("task", "built", "reward untouched", "reward with oracle", "s", "result")
    for r in results:
        table.add_row(
            _shown(r.task_id),
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


@app.command("run")
def tasks_run(
    path: str = typer.Argument(..., help="A task directory, a directory of them, or 'builtin' (the shipped suite)."),
    agent: str = typer.Option("oracle", help="oracle (the reference solution) or null (does nothing)."),
    concurrency: int = typer.Option(2, help="Tasks run at once."),
    json_out: bool = typer.Option(False, "--json", help="End with one JSON line of the results."),
    swebench_images: str | None = typer.Option(None, help=SWEBENCH_IMAGES_HELP),
    sandboxes: str | None = typer.Option(None, help=sandboxes_help("local")),
) -> None:
    """Run every task with the oracle or the null agent through the real verifier; print the pass rate."""
    from sandrl.progress import Progress
    from sandrl.wiring.sandboxes import open_provider
    from sandrl.wiring.suite import run_suite

    if agent not in ("oracle", "null"):
        raise ConfigError(f"--agent must be oracle or null, got {agent!r}")
    if concurrency < 1:
        raise ConfigError("--concurrency must be at least 1")
    rollout = _sandboxes(sandboxes)
    kind: AgentKind = "oracle" if agent == "oracle" else "null"
    console = rich_console(stderr=json_out)
    tasks, problems = _load(path, console, swebench_images)
    start = time.monotonic()

    async def go() -> list[TaskRun]:
        async with open_provider(rollout) as provider:
            with Progress(console=console) as progress:
                bar = progress.add_task(f"{agent} agent", total=len(tasks))

                def done(task: Task, result: TaskRun) -> None:
                    progress.advance(bar)
                    if not result.passed:
                        # Why, as it happens (one bounded line): the table's column keeps only its start.
                        label = "[yellow]error[/]" if result.error is not None else "[red]fail[/]"
                        progress.console.print(
                            f"{label} {_shown(task.id)} (reward {result.reward:g}): {_shown(result.reason)}",
                            highlight=False,
                            soft_wrap=True,
                        )

                return await run_suite(tasks, kind, provider, concurrency=concurrency, on_done=done)

    results = asyncio.run(go())
    elapsed = time.monotonic() - start
    table = Table("task", "reward", "passed", "build s", "total s", "why not passed")
    for r in results:
        table.add_row(
            _shown(r.task_id),
            f"{r.reward:g}",
            "yes" if r.passed else "no",
            f"{r.build_s:.2f}",
            f"{r.duration_s:.1f}",
            _shown((r.reason or "")[:120]),
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
        emit(summary)
    if errors or problems:
        raise typer.Exit(1)


@app.command("pull")
def tasks_pull(
    args: list[str] = typer.Argument(
        ..., metavar="[REGISTRY] NAME@VERSION", help="The dataset, after a registry.json path or URL if you name one."
    ),
    registry: str | None = typer.Option(
        None,
        help="A registry URL or registry.json path (default: registry in ~/.config/sandrl/datasets.toml, "
        "else Harbor's public registry).",
    ),
    out: Path | None = typer.Option(None, help="The dataset directory to write (default: datasets/NAME@VERSION)."),
    jobs: int = typer.Option(DATASET_JOBS, help="Repositories fetched at once (and images, with --images)."),
    timeout_s: float = typer.Option(DATASET_GIT_TIMEOUT_S, help="Seconds one git command may take."),
    images: bool = typer.Option(
        False, "--images", help="Then pull or build every task's image into this host's store (sandrl images prefetch)."
    ),
    json_out: bool = typer.Option(False, "--json", help="End with one JSON line of what was pulled."),
) -> None:
    """Fetch a dataset's tasks (Harbor's registry format) with git, into a directory eval and train take."""
    from sandrl.progress import Progress
    from sandrl.tasks.datasets import (
        cache_root,
        default_registry,
        find_dataset,
        parse_spec,
        pull_dataset,
        read_registry,
    )

    if len(args) > 2:
        raise ConfigError("give NAME@VERSION, or a registry and NAME@VERSION")
    if len(args) == 2 and registry is not None:
        raise ConfigError(f"the registry is named twice ({args[0]} and --registry {registry}); give one")
    name, version = parse_spec(args[-1])
    source = args[0] if len(args) == 2 else registry or default_registry()
    console = rich_console(quiet=json_out)
    cache = cache_root()
    datasets, note = read_registry(source, cache)
    if note is not None:
        print_error(note, label="warning")  # even with --json: the dataset may be out of date
    dataset = find_dataset(datasets, name, version, source)
    target = out if out is not None else Path("datasets") / dataset.spec

    with Progress(console=console) as progress:
        bar = progress.add_task(f"pulling {dataset.spec}", total=len(dataset.tasks))

        def done(outcome: TaskOutcome) -> None:
            progress.advance(bar)

        report = pull_dataset(dataset, target, cache=cache, jobs=jobs, timeout_s=timeout_s, on_done=done)
    written = report.written
    cached = sum(o.from_cache for o in written)
    console.print(
        f"{dataset.spec}: {len(written)}/{len(report.outcomes)} tasks in {_shown(target)} "
        f"({len(written) - cached} fetched, {cached} from the cache; {report.network_calls} git network calls "
        f"to {report.repositories} repositor{'y' if report.repositories == 1 else 'ies'}) in {report.seconds:.1f} s",
        highlight=False,
        soft_wrap=True,
    )
    if report.removed:
        console.print(f"removed {len(report.removed)} tasks the dataset no longer lists", highlight=False)
    for outcome in report.failed:
        console.print(
            f"[red]failed[/] {_shown(outcome.label)}: {_shown(outcome.reason)}", highlight=False, soft_wrap=True
        )
    summary = report.to_dict()
    images_failed = 0
    if images and written:
        loaded, _ = _load(str(target), console, None)
        fetched = prefetch_tasks(loaded, jobs=jobs, console=console)
        summary["images"] = fetched.to_dict()
        images_failed = fetched.count("failed")
    if written:
        console.print(f"next: sandrl eval {_shown(target)} --agent oracle", highlight=False, soft_wrap=True)
    if json_out:
        emit(summary)
    if report.failed or images_failed:
        raise typer.Exit(1)
