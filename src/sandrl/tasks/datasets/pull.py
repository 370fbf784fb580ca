"""``sandrl tasks pull``: a registry's dataset as a directory of task directories.

::

    report = pull_dataset(dataset, Path("datasets/terminal-bench@2.0"))
    report.failed        # [TaskOutcome(label, reason, ...)]: the others are written

The dataset directory holds one directory per task (named as Harbor's ``harbor datasets
download`` names it: the last part of the task's path) and ``.sandrl/dataset.json``, what was
pulled (name, version, and each task's repository, commit, path and tree id). ``sandrl eval``
and ``[tasks] path`` take it as it is (the loader skips ``.sandrl``). Pulling again rewrites
only the tasks whose tree changed, removes the ones the dataset no longer lists, and never
touches a directory it did not write.

Repositories are fetched in parallel (``jobs`` at once), each once for all its tasks (see
:mod:`sandrl.tasks.datasets.fetch`); a task that cannot be had is reported with its reason and the
rest is written.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandrl.errors import ConfigError
from sandrl.fetch_limits import DATASET_GIT_TIMEOUT_S, DATASET_JOBS
from sandrl.tasks.datasets.fetch import Refused, Repository, cache_root, export_tree
from sandrl.tasks.datasets.git import GitFailed
from sandrl.tasks.datasets.registry import Dataset, TaskSource, check_task

__all__ = ["MANIFEST", "PullReport", "TaskOutcome", "pull_dataset"]

MANIFEST = Path(".sandrl") / "dataset.json"
"""Under the dataset directory: what the last pull wrote there."""


@dataclass(frozen=True)
class TaskOutcome:
    """One task of a pull: written (``reason`` is None) or not (``reason`` says why)."""

    label: str
    dir_name: str | None = None
    commit: str | None = None
    tree: str | None = None
    from_cache: bool = False
    """Nothing of it had to be fetched."""
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.reason is None


@dataclass
class PullReport:
    """What a pull did: each task's outcome, in the registry's order, and the git network calls."""

    dataset: str
    out: Path
    outcomes: list[TaskOutcome] = field(default_factory=list)
    network_calls: int = 0
    repositories: int = 0
    removed: list[str] = field(default_factory=list)
    """Task directories an earlier pull wrote that the dataset no longer lists."""
    seconds: float = 0.0

    @property
    def written(self) -> list[TaskOutcome]:
        return [o for o in self.outcomes if o.ok]

    @property
    def failed(self) -> list[TaskOutcome]:
        return [o for o in self.outcomes if not o.ok]

    def to_dict(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "out": str(self.out),
            "tasks": len(self.outcomes),
            "written": len(self.written),
            "from_cache": sum(o.from_cache for o in self.written),
            "failed": [{"task": o.label, "reason": o.reason} for o in self.failed],
            "repositories": self.repositories,
            "network_calls": self.network_calls,
            "removed": self.removed,
            "seconds": round(self.seconds, 2),
        }


def pull_dataset(
    dataset: Dataset,
    out: Path,
    *,
    cache: Path | None = None,
    jobs: int = DATASET_JOBS,
    timeout_s: float = DATASET_GIT_TIMEOUT_S,
    on_done: Callable[[TaskOutcome], None] | None = None,
) -> PullReport:
    """Fetch every task of ``dataset`` into the cache (``cache``, default :func:`cache_root`) and
    write the dataset directory ``out``. ``on_done`` is called (from worker threads) as each task
    is written or refused. Raises :class:`ConfigError` only when ``out`` cannot be used at all."""
    if jobs < 1:
        raise ConfigError("--jobs must be at least 1")
    start = time.monotonic()
    cache = cache or cache_root()
    out = Path(out)
    previous = _read_manifest(out, dataset)
    report = PullReport(dataset=dataset.spec, out=out)
    done: dict[int, TaskOutcome] = {}

    def finish(index: int, outcome: TaskOutcome) -> None:
        done[index] = outcome
        if on_done is not None:
            on_done(outcome)

    by_repository: dict[str, list[tuple[int, TaskSource]]] = defaultdict(list)
    taken: dict[str, str] = {}
    for task in dataset.tasks:
        source = check_task(task)
        if isinstance(source, str):
            finish(task.index, TaskOutcome(task.label, reason=source))
        elif source.dir_name in taken:
            reason = f"its directory {source.dir_name!r} is also {taken[source.dir_name]!r}'s; one of them must move"
            finish(task.index, TaskOutcome(task.label, reason=reason))
        elif (out / source.dir_name).exists() and source.dir_name not in previous:
            reason = (
                f"{out / source.dir_name} exists and was not written by a pull; move it away or pull into another --out"
            )
            finish(task.index, TaskOutcome(task.label, reason=reason))
        else:
            taken[source.dir_name] = source.label
            by_repository[source.repository].append((task.index, source))

    out.mkdir(parents=True, exist_ok=True)
    for pattern in ("tmp-*", "old-*"):  # what an interrupted pull left behind
        for left in (out / MANIFEST.parent).glob(pattern):
            shutil.rmtree(left, ignore_errors=True)
    repositories = [Repository(cache, tasks[0][1].url, timeout_s) for tasks in by_repository.values()]
    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="sandrl-pull") as pool:
        jobs_done = [
            pool.submit(_pull_repository, repository, tasks, cache / "trees", out, previous, finish)
            for repository, tasks in zip(repositories, by_repository.values(), strict=True)
        ]
        for job in jobs_done:
            job.result()

    report.outcomes = [done[i] for i in sorted(done)]
    report.repositories = len(repositories)
    report.network_calls = sum(r.network_calls for r in repositories)
    listed = {o.dir_name for o in report.written} | set(taken)
    for name in sorted(set(previous) - listed):
        shutil.rmtree(out / name, ignore_errors=True)
        report.removed.append(name)
    kept = {name: entry for name, entry in previous.items() if name in taken}  # failed this time: as they were
    sources = {source.dir_name: source for tasks in by_repository.values() for _, source in tasks}
    for o in report.written:
        assert o.dir_name is not None
        source = sources[o.dir_name]
        kept[o.dir_name] = {
            "task": o.label,
            "url": source.url,
            "path": source.path,
            "ref": source.ref,
            "commit": o.commit,
            "tree": o.tree,
        }
    _write_manifest(out, dataset, kept)
    report.seconds = time.monotonic() - start
    return report


def _pull_repository(
    repository: Repository,
    tasks: list[tuple[int, TaskSource]],
    trees_dir: Path,
    out: Path,
    previous: dict[str, dict[str, Any]],
    finish: Callable[[int, TaskOutcome], None],
) -> None:
    """Fetch one repository for all its tasks, then write each task; every task is finished."""
    pending = dict(tasks)
    commits: dict[int, str] = {}
    trees: dict[int, str] = {}
    fetched: set[int] = set()

    def fail(index: int, reason: str) -> None:
        finish(index, TaskOutcome(pending.pop(index).label, dir_name=None, reason=reason))

    try:
        with repository.locked():
            unpinned = {s.ref for s in pending.values() if not s.pinned}
            resolved = repository.resolve(unpinned) if unpinned else {}
            for index, source in list(pending.items()):
                commit = source.ref if source.pinned else resolved.get(source.ref)
                if commit is None:
                    fail(index, f"{source.ref!r} is not a branch or tag of {source.url}")
                else:
                    commits[index] = commit
            need = {c for c in set(commits.values()) if not repository.has_commit(c)}
            fetched |= {i for i in pending if commits[i] in need or not pending[i].pinned}
            for commit, reason in repository.fetch_commits(need).items():
                for index in [i for i in pending if commits[i] == commit]:
                    fail(index, reason)
            places = repository.trees((commits[i], pending[i].path) for i in pending)
            for index in list(pending):
                tree = places[commits[index], pending[index].path]
                if tree.startswith("!"):
                    fail(index, tree[1:])
                else:
                    trees[index] = tree
            exported = {i for i in pending if (trees_dir / trees[i]).is_dir()}
            fetched |= set(pending) - exported
            missing = repository.fetch_files(
                (trees[i] for i in pending if i not in exported), (commits[i] for i in pending if i not in exported)
            )
            if missing is not None:
                for index in [i for i in pending if i not in exported]:
                    fail(index, missing)
    except (GitFailed, OSError) as exc:
        why = exc.reason if isinstance(exc, GitFailed) else f"cannot use the cache {repository.git_dir}: {exc}"
        for index in list(pending):
            fail(index, why)
        return
    for index, source in list(pending.items()):
        try:
            tree_dir = export_tree(repository, trees[index], trees_dir)
            _install(tree_dir, out, source.dir_name, trees[index], previous)
        except (Refused, GitFailed) as exc:
            fail(index, exc.reason)
            continue
        except OSError as exc:
            fail(index, f"cannot write {out / source.dir_name}: {exc.strerror or exc}")
            continue
        pending.pop(index)
        finish(
            index,
            TaskOutcome(source.label, source.dir_name, commits[index], trees[index], from_cache=index not in fetched),
        )


def _install(tree_dir: Path, out: Path, name: str, tree: str, previous: dict[str, dict[str, Any]]) -> None:
    """``out/name`` becomes a copy of ``tree_dir`` (unless an earlier pull left it so already)."""
    target = out / name
    if previous.get(name, {}).get("tree") == tree and target.is_dir():
        return
    staging = out / ".sandrl" / f"tmp-{uuid.uuid4().hex[:12]}"
    staging.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(tree_dir, staging, symlinks=True)
    if target.exists() or target.is_symlink():
        old = out / ".sandrl" / f"old-{uuid.uuid4().hex[:12]}"
        target.rename(old)
        shutil.rmtree(old, ignore_errors=True)
    staging.rename(target)


def _read_manifest(out: Path, dataset: Dataset) -> dict[str, dict[str, Any]]:
    """The tasks an earlier pull wrote into ``out`` (none for a new directory)."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out} is a file; pull into a directory (--out DIR)")
    file = out / MANIFEST
    if not file.is_file():
        return {}
    try:
        data = json.loads(file.read_text())
        pulled, tasks = data["dataset"], data["tasks"]
        if not isinstance(tasks, dict) or not all(isinstance(v, dict) for v in tasks.values()):
            raise TypeError("tasks")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{file} is not what a pull writes ({exc}); remove it, or pull into another --out") from exc
    if pulled != dataset.spec:
        raise ConfigError(f"{out} holds {pulled}, not {dataset.spec}; pull into another --out")
    return {
        name: entry
        for name, entry in tasks.items()
        if isinstance(name, str) and "/" not in name and name not in (".", "..", "")
    }


def _write_manifest(out: Path, dataset: Dataset, tasks: dict[str, dict[str, Any]]) -> None:
    file = out / MANIFEST
    file.parent.mkdir(parents=True, exist_ok=True)
    partial = file.with_suffix(f".{os.getpid()}.part")
    partial.write_text(json.dumps({"dataset": dataset.spec, "tasks": dict(sorted(tasks.items()))}, indent=1) + "\n")
    partial.replace(file)
