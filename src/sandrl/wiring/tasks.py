"""The task set of a :class:`~sandrl.wiring.config.TasksConfig`, or of a path given on a command line."""

from __future__ import annotations

from pathlib import Path

from sandrl.errors import ConfigError
from sandrl.tasks.loader import load_tasks
from sandrl.tasks.task import Task
from sandrl.wiring.config import TasksConfig


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
    """The tasks of ``tasks``: a generated family written under ``root``, or the task set at its path.

    A family is written again in full (byte-identical for the same family, count and seed), so
    every process of a run that writes it, each under a ``root`` of its own, has the same tasks.
    """
    if tasks.family:
        from sandrl.tasks.builtin.generated import generate_tasks

        generate_tasks(root, tasks.family, tasks.count, tasks.seed, overwrite=True)
        return load_task_set(root)
    return load_task_set(tasks.path, swebench_images=tasks.swebench_images)
