"""Finding and loading tasks, whatever their format.

``load_task(path)`` loads one task and raises on a malformed one; ``load_tasks(path)`` loads a
whole set and returns the good tasks together with a ``(path, problem)`` entry for each bad one,
so that one broken task does not hide the others (``sandrl tasks validate`` prints the problems).

The format is told by what the path holds: ``task.toml`` → Harbor; ``task.yaml`` → Terminal-Bench
1; a ``.json`` / ``.jsonl`` / ``.parquet`` file → instance rows of SWE-bench, SWE-Gym, SWE-smith
or R2E-Gym, each row's dataset told by its keys (:mod:`sandrl.tasks.rows`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from sandrl.errors import InvalidTaskError
from sandrl.tasks.harbor import INSTRUCTION, is_harbor_dir, load_harbor_task
from sandrl.tasks.rows import first_record, is_row_file, looks_like_row, row_format
from sandrl.tasks.swebench import load_swebench_instances
from sandrl.tasks.task import Task, TaskFormat
from sandrl.tasks.terminal_bench import is_terminal_bench_dir, load_terminal_bench_task

logger = logging.getLogger(__name__)

MAX_DEPTH = 3
"""How far below the given directory task directories are looked for (``suite/dataset/task``)."""
_SKIPPED_DIRS = {"__pycache__", "node_modules", "repos"}


class TaskProblem(NamedTuple):
    """A task that could not be loaded: where it is and what is wrong (with the fix)."""

    path: Path
    problem: str


def detect_format(path: Path) -> TaskFormat:
    """The format of a task directory or instance file; raises if it is none of them."""
    path = Path(path)
    if not path.exists():
        raise InvalidTaskError(f"{path}: does not exist", path=path)
    if path.is_file():
        if is_row_file(path):
            first = first_record(path)
            return row_format(first) if isinstance(first, Mapping) else "swe-bench"
        raise InvalidTaskError(
            f"{path}: is not a task; give a task directory or a file of SWE-bench, SWE-Gym, SWE-smith or "
            "R2E-Gym instances (.json, .jsonl, .parquet)",
            path=path,
        )
    if is_harbor_dir(path):
        return "harbor"
    if is_terminal_bench_dir(path):
        return "terminal-bench"
    hint = (
        f"it has {INSTRUCTION} but no task.toml, which a Harbor task needs"
        if (path / INSTRUCTION).is_file()
        else "expected task.toml (Harbor) or task.yaml (Terminal-Bench)"
    )
    raise InvalidTaskError(f"{path}: is not a task directory of a known format; {hint}", path=path)


def load_task(
    path: Path, *, repos: Path | None = None, test_command: str | None = None, swebench_images: str | None = None
) -> Task:
    """Load one task: a Harbor or Terminal-Bench directory, or a file holding one instance row.

    ``repos``, ``test_command`` and ``swebench_images`` apply to instance rows only (see
    :func:`load_swebench_instances`: the published image of each instance, or a local clone).
    """
    path = Path(path)
    kind = detect_format(path)
    if kind == "harbor":
        return load_harbor_task(path)
    if kind == "terminal-bench":
        return load_terminal_bench_task(path)
    tasks, errors = load_swebench_instances(path, repos=repos, test_command=test_command, images=swebench_images)
    if errors:
        raise errors[0]
    if len(tasks) != 1:
        raise InvalidTaskError(
            f"{path}: holds {len(tasks)} instances, not one; use load_tasks (sandrl tasks list) for a set", path=path
        )
    return tasks[0]


def _looks_like_task(path: Path) -> bool:
    return any((path / name).is_file() for name in ("task.toml", "task.yaml", "task.yml", INSTRUCTION))


def _is_repository(path: Path) -> bool:
    # A mirror of SWE-bench repositories is full of files that are not tasks.
    return (path / ".git").exists() or ((path / "HEAD").is_file() and (path / "objects").is_dir())


def _holds_instances(path: Path) -> bool:
    """A top-level .json/.jsonl/.parquet counts as instance rows when its first record is one."""
    try:
        first = first_record(path)
    except InvalidTaskError:
        return True  # malformed: report it rather than skip it silently
    return looks_like_row(first)


def _task_dirs(root: Path, depth: int) -> list[Path]:
    found: list[Path] = []
    for child in sorted(root.iterdir()):
        if not child.is_dir() or child.name.startswith(".") or child.name in _SKIPPED_DIRS:
            continue
        if _looks_like_task(child):
            found.append(child)
        elif depth < MAX_DEPTH and not _is_repository(child):
            found.extend(_task_dirs(child, depth + 1))
    return found


def load_tasks(
    path: Path, *, repos: Path | None = None, test_command: str | None = None, swebench_images: str | None = None
) -> tuple[list[Task], list[TaskProblem]]:
    """Every task under ``path`` (a task directory, a directory of them, or a file of instance rows).

    Returns the tasks that loaded, sorted by id, and a :class:`TaskProblem` for each that did not
    (a duplicate id is a problem too; a malformed row is one, naming its row, id and why). Task
    directories are found up to :data:`MAX_DEPTH` levels down; ``.json``/``.jsonl``/``.parquet``
    files directly in ``path`` are read as instance rows (a Hugging Face dataset's ``data/``
    directory of shards, say; SWE-bench's in ``swebench_images``' images or from local clones; see
    :func:`load_swebench_instances`).
    """
    path = Path(path)
    tasks: list[Task] = []
    problems: list[TaskProblem] = []
    if not path.exists():
        return [], [TaskProblem(path, f"{path}: does not exist")]

    if path.is_file() or _looks_like_task(path):
        candidates = [path]
    else:
        instance_files = sorted(p for p in path.iterdir() if is_row_file(p) and _holds_instances(p))
        candidates = [*instance_files, *_task_dirs(path, 1)]
        if not candidates:
            logger.info("no tasks under %s", path)

    for candidate in candidates:
        try:
            if candidate.is_file() and is_row_file(candidate):
                loaded, errors = load_swebench_instances(
                    candidate, repos=repos, test_command=test_command, images=swebench_images
                )
                tasks.extend(loaded)
                problems.extend(TaskProblem(candidate, str(error)) for error in errors)
            else:
                tasks.append(load_task(candidate))
        except InvalidTaskError as exc:
            problems.append(TaskProblem(candidate, str(exc)))

    unique: dict[str, Task] = {}
    for task in tasks:
        if task.id in unique:
            problems.append(
                TaskProblem(
                    task.source,
                    f"{task.source}: task id {task.id!r} is also used by {unique[task.id].source}; rename one",
                )
            )
            continue
        unique[task.id] = task
    return sorted(unique.values(), key=lambda task: task.id), problems
