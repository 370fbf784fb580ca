"""The task set of a :class:`~sandrl.wiring.config.TasksConfig` (its sources, mixed by :mod:`~sandrl.wiring.task_mix`
for a training run), or of a path given on a command line."""

from __future__ import annotations

from pathlib import Path

from sandrl.errors import ConfigError
from sandrl.tasks.loader import load_tasks
from sandrl.tasks.task import Task
from sandrl.wiring.config import TasksConfig, TaskSource
from sandrl.wiring.task_mix import MixSource, TaskMix


def task_path(spec: str | Path) -> Path:
    """Where the tasks of ``spec`` are: the shipped suite for ``builtin``, else the path itself."""
    if str(spec) == "builtin":
        from sandrl.tasks.builtin import SUITE_DIR

        return SUITE_DIR
    return Path(spec)


def load_task_set(spec: str | Path, *, swebench_images: str | None = None) -> list[Task]:
    """The tasks of ``spec`` (``builtin`` or a path); loading problems are a ConfigError listing them.

    ``swebench_images``: where SWE-bench instances run (:attr:`TasksConfig.swebench_images`).
    """
    path = task_path(spec)
    tasks, problems = load_tasks(path, swebench_images=swebench_images or None)
    if problems:
        listed = "\n".join(f"  {p.problem}" for p in problems[:10])
        raise ConfigError(f"{len(problems)} task(s) under {path} did not load:\n{listed}")
    if not tasks:
        raise ConfigError(f"no tasks under {path}: give a task directory, a directory of them, or 'builtin'")
    return tasks


def task_set(tasks: TasksConfig, root: Path) -> list[Task]:
    """The tasks of ``tasks``: a generated family written under ``root``, the task set at its path, or
    every task of its ``[[tasks.sources]]`` (a family source under ``root/<name>``).

    A family is written again in full (byte-identical for the same family, count and seed), so
    every process of a run that writes it, each under a ``root`` of its own, has the same tasks.
    """
    return [t for source in task_sources(tasks, root) for t in source.tasks]


def task_mix(tasks: TasksConfig, root: Path, seed: int) -> TaskMix:
    """What a training run draws its tasks from, at each data position, with ``[run] seed`` (see :func:`task_set`)."""
    return TaskMix(task_sources(tasks, root), seed)


def task_sources(tasks: TasksConfig, root: Path) -> list[MixSource]:
    """The sources of ``tasks``, loaded: its ``[[tasks.sources]]``, or its one task set (weight 1, no end).

    A task id may be in one source only: a run names its groups, and a cluster's workers its tasks, by id.
    """
    if not tasks.sources:
        if tasks.family:
            from sandrl.tasks.builtin.generated import generate_tasks

            generate_tasks(root, tasks.family, tasks.count, tasks.seed, overwrite=True)
            return [MixSource(tasks.family, 1.0, tuple(load_task_set(root)))]
        loaded = load_task_set(tasks.path, swebench_images=tasks.swebench_images)
        return [MixSource(task_path(tasks.path).name, 1.0, tuple(loaded))]
    sources = [
        MixSource(s.name, s.weight, tuple(_load_source(s, root, tasks.swebench_images)), s.epochs)
        for s in tasks.sources
    ]
    owner: dict[str, MixSource] = {}
    for source in sources:
        for task in source.tasks:
            first = owner.setdefault(task.id, source)
            if first is not source:
                raise ConfigError(
                    f"task id {task.id!r} is in [[tasks.sources]] {first.name!r} and {source.name!r}: a run names "
                    "its groups by task id, so each id may be in one source only; rename one or drop it"
                )
    return sources


def _load_source(source: TaskSource, root: Path, swebench_images: str) -> list[Task]:
    where = f"[[tasks.sources]] {source.name!r}"
    if source.family:
        from sandrl.tasks.builtin.generated import generate_tasks

        generate_tasks(root / source.name, source.family, source.count, source.seed, overwrite=True)
        return load_task_set(root / source.name)
    path = task_path(source.path)
    if not path.exists():
        raise ConfigError(
            f"{where}: path {source.path} does not exist: give a task directory, a directory of them, "
            "a row file or 'builtin' (a relative path is relative to the config file)"
        )
    try:
        return load_task_set(path, swebench_images=swebench_images)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc.message}") from exc
