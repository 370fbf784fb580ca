"""The local cache of task files fetched with git: one bare repository per repository, one
directory per task tree.

::

    $SANDRL_CACHE_DIR/datasets/          (default ~/.cache/sandrl/datasets)
    ├── git/<key>.git                    a bare repository per git URL: the commits fetched so far
    ├── trees/<tree id>/                 a task directory as git's tree id names it (content-addressed)
    └── registries/<key>.json            the last copy of each registry fetched over HTTP

A repository is fetched once for all its tasks: ``git fetch --depth 1 --filter=blob:none origin
C1 C2 ...`` brings the pinned commits and their trees only, then one more fetch brings the files
of the tasks' directories and of nothing else (a server that does not filter sends them all at
once). A server that refuses to send a commit by its id (``uploadpack.allowAnySHA1InWant`` unset,
protocol v0) is fetched in full, its branches and tags, instead. A commit already in the cache is
not fetched again, and a tree already exported is not read again: a second pull of a pinned
dataset makes no network call at all. Every command that reads the cache runs with no transport
allowed, so a missing object is an error, never a fetch.

A tree is exported by sandrl itself, from ``git ls-tree`` and ``git cat-file``, never by a
checkout: regular files get mode 644 or 755, a submodule or a git-lfs pointer (whose content is
not in the repository) is refused, and a symbolic link is kept
only when it resolves inside the task directory (an absolute link, or one reaching out through
``..`` or through another link, refuses the task). A task is bounded in files and bytes.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import uuid
from collections import defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from sandrl.cache_dirs import cache_dir
from sandrl.tasks.datasets.git import GitFailed, GitRunner, one_line, repository_key

__all__ = ["MAX_TASK_BYTES", "MAX_TASK_FILES", "Refused", "Repository", "cache_root", "export_tree"]

MAX_TASK_FILES = 100_000
MAX_TASK_BYTES = 4 << 30
"""A task directory's files, together: a bound against a repository that is a bomb."""
MAX_LINK_CHARS = 4096
LFS_POINTER = b"version https://git-lfs.github.com/spec/"
MAX_LFS_POINTER_BYTES = 1024
"""A small file starting so is a git-lfs pointer: the task's real file is elsewhere, and refused."""


class Refused(Exception):
    """This task cannot be had (``reason``: one line saying why); the others go on."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def cache_root() -> Path:
    """``$SANDRL_CACHE_DIR/datasets``, else ``$XDG_CACHE_HOME/sandrl/datasets`` or ``~/.cache/sandrl/datasets``."""
    return cache_dir("datasets")


class Repository:
    """The cache's bare copy of one git URL (every spelling of it: :func:`repository_key`)."""

    def __init__(self, cache: Path, url: str, timeout_s: float) -> None:
        key = hashlib.sha256(repository_key(url).encode()).hexdigest()[:32]
        self.url = url
        self.git_dir = cache / "git" / f"{key}.git"
        self.git = GitRunner(self.git_dir, url, timeout_s)

    @property
    def network_calls(self) -> int:
        return self.git.network_calls

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Held while fetching: two pulls sharing the cache fetch one repository one at a time."""
        self.git_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(self.git_dir.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if not (self.git_dir / "HEAD").is_file():
                    self.git.run(["init", "--bare", "--quiet", str(self.git_dir)])
                self.git.run(["config", "remote.origin.url", self.url])
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def resolve(self, refs: Iterable[str]) -> dict[str, str]:
        """Each branch, tag or ``HEAD`` in ``refs`` as the server names it now (one ``ls-remote``);
        a name the server does not have is left out."""
        wanted = sorted(set(refs))
        listed: dict[str, str] = {}
        for line in self.git.text(["ls-remote", "origin", *wanted], network=True).splitlines():
            oid, _, name = line.partition("\t")
            listed[name.strip()] = oid.strip().lower()
        found = {}
        for ref in wanted:
            for name in (ref, f"refs/tags/{ref}^{{}}", f"refs/tags/{ref}", f"refs/heads/{ref}"):
                if name in listed:
                    found[ref] = listed[name]
                    break
        return found

    def has_commit(self, commit: str) -> bool:
        return self.git.run(["cat-file", "-e", f"{commit}^{{commit}}"], check=False).returncode == 0

    def fetch_commits(self, commits: Iterable[str]) -> dict[str, str]:
        """Fetch the commits (and their trees) not in the cache yet; why each one still missing is missing."""
        missing = sorted(c for c in set(commits) if not self.has_commit(c))
        if not missing:
            return {}
        refspecs = [f"{c}:refs/sandrl/{c}" for c in missing]
        first = ""
        try:
            self.git.run(
                ["fetch", "--quiet", "--no-tags", "--depth", "1", "--filter=blob:none", "origin", *refspecs],
                network=True,
            )
        except GitFailed as exc:
            first = exc.reason
            # Refused by id (protocol v0 without allowAnySHA1InWant) or not there at all: take every
            # branch and tag (commits and trees only) and look again.
            with contextlib.suppress(GitFailed):
                self.git.run(
                    [
                        "fetch",
                        "--quiet",
                        "--no-tags",
                        "--filter=blob:none",
                        "origin",
                        "+refs/heads/*:refs/sandrl/heads/*",
                        "+refs/tags/*:refs/sandrl/tags/*",
                    ],
                    network=True,
                )
        reasons = {}
        for commit in missing:
            if self.has_commit(commit):
                self.git.run(["update-ref", f"refs/sandrl/{commit}", commit])
            else:
                reasons[commit] = f"commit {commit} is not in {self.url}" + (f" ({first})" if first else "")
        return reasons

    def trees(self, places: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
        """The tree id of each ``(commit, path)``, or why there is none (``"!reason"``).

        Read from the listing of each path's parent, never from the object itself: a path that
        names a file whose content is not fetched is told apart without fetching it."""
        by_parent: dict[tuple[str, str], list[str]] = defaultdict(list)
        for commit, path in set(places):
            parent, _, name = path.rpartition("/")
            by_parent[commit, parent].append(name)
        found: dict[tuple[str, str], str] = {}
        for (commit, parent), names in by_parent.items():
            spec = f"{commit}:{parent}" if parent else f"{commit}^{{tree}}"
            listed = self.git.run(["ls-tree", "-z", spec], check=False)
            entries = {}
            if listed.returncode == 0:
                for record in listed.stdout.split(b"\0"):
                    meta, _, entry = record.partition(b"\t")
                    if meta:
                        entries[entry.decode("utf-8", "surrogateescape")] = meta.decode().split()
            for name in names:
                path = f"{parent}/{name}" if parent else name
                if not name:  # the repository's root
                    root = self.git.text(["rev-parse", "--verify", "-q", spec]).strip()
                    found[commit, path] = root
                elif name not in entries:
                    found[commit, path] = f"!path {path!r} is not in {self.url} at commit {commit[:12]}"
                elif entries[name][1] != "tree":
                    found[commit, path] = f"!{path} in {self.url} at {commit[:12]} is a file, not a task directory"
                else:
                    found[commit, path] = entries[name][2]
        return found

    def fetch_files(self, trees: Iterable[str], commits: Iterable[str]) -> str | None:
        """Fetch what is missing of the files under ``trees`` (in one request); why not, if they cannot be had."""
        trees = sorted(set(trees))
        if not trees:
            return None
        missing = self._missing(trees)
        if not missing:
            return None
        try:
            self.git.run(
                [
                    # As git's own lazy fetch asks: with no "have" lines, or the server, seeing the
                    # commit, would assume its files are here already and send none.
                    "-c",
                    "fetch.negotiationAlgorithm=noop",
                    "fetch",
                    "--quiet",
                    "--no-tags",
                    "--no-write-fetch-head",
                    "--recurse-submodules=no",
                    "--filter=blob:none",
                    "--stdin",
                    "origin",
                ],
                network=True,
                stdin="".join(f"{oid}\n" for oid in missing).encode(),
            )
        except GitFailed as exc:
            # A server that will not send objects by id: the commits again, whole.
            try:
                self.git.run(
                    [
                        "fetch",
                        "--quiet",
                        "--no-tags",
                        "--no-filter",
                        "--refetch",
                        "--depth",
                        "1",
                        "origin",
                        *sorted(set(commits)),
                    ],
                    network=True,
                )
            except GitFailed:
                return f"cannot fetch its files from {self.url}: {exc.reason}"
        still = self._missing(trees)
        return f"{len(still)} of its files are missing from what {self.url} sent" if still else None

    def _missing(self, trees: list[str]) -> list[str]:
        listed = self.git.text(["rev-list", "--objects", "--missing=print", *trees])
        return sorted({line[1:].strip() for line in listed.splitlines() if line.startswith("?")})


def export_tree(repository: Repository, tree: str, trees_dir: Path) -> Path:
    """``trees_dir/<tree>``: the tree's files, written as the module says (at once if there already)."""
    target = trees_dir / tree
    if target.is_dir():
        return target
    entries = _entries(repository, tree)
    trees_dir.mkdir(parents=True, exist_ok=True)
    staging = trees_dir / f".tmp-{tree[:16]}-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        _write(repository, entries, staging)
        with contextlib.suppress(OSError):  # another pull exported it meanwhile: the same files
            staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    if not target.is_dir():
        raise Refused(f"could not store tree {tree} in {trees_dir}")
    return target


def _entries(repository: Repository, tree: str) -> list[tuple[str, str, int, str]]:
    """``(mode, oid, size, path)`` of every file under ``tree``, checked against the bounds."""
    listed = repository.git.run(["ls-tree", "-r", "-l", "-z", "--full-tree", tree]).stdout
    entries = []
    total = 0
    for record in listed.split(b"\0"):
        if not record:
            continue
        meta, _, raw_path = record.partition(b"\t")
        mode, _, oid, size = meta.decode().split()
        path = raw_path.decode("utf-8", "surrogateescape")
        shown = one_line(path, 120)
        parts = path.split("/")
        if any(p in ("", ".", "..") for p in parts):
            raise Refused(f"holds a file named {shown!r}, which would leave its directory")
        if mode == "160000":
            raise Refused(f"holds a git submodule at {shown!r}, which is not fetched; vendor its files instead")
        if mode not in ("100644", "100755", "120000"):
            raise Refused(f"holds {shown!r} of git mode {mode}, which is not a file or a link")
        entries.append((mode, oid, int(size), path))
        total += int(size)
        if len(entries) > MAX_TASK_FILES or total > MAX_TASK_BYTES:
            raise Refused(f"is over {MAX_TASK_FILES} files or {MAX_TASK_BYTES >> 30} GiB")
    return entries


def _write(repository: Repository, entries: list[tuple[str, str, int, str]], root: Path) -> None:
    links: list[tuple[str, bytes]] = []
    reader = repository.git.cat_file()
    assert reader.stdin is not None and reader.stdout is not None
    try:
        for mode, oid, size, path in entries:
            reader.stdin.write(f"{oid}\n".encode())
            reader.stdin.flush()
            header = reader.stdout.readline().split()
            if len(header) != 3 or header[1] != b"blob" or int(header[2]) != size:
                raise Refused(f"the content of {one_line(path, 120)!r} is not in the cache")
            if mode == "120000":
                if size > MAX_LINK_CHARS:
                    raise Refused(f"symlink {one_line(path, 120)!r} is over {MAX_LINK_CHARS} characters")
                links.append((path, reader.stdout.read(size)))
            else:
                _write_file(reader.stdout, size, root, path, 0o755 if mode == "100755" else 0o644)
            reader.stdout.read(1)
    finally:
        reader.stdin.close()
        reader.stdout.close()
        reader.wait()
    # Links last, once every file is written: no write ever goes through one.
    real_root = os.path.realpath(root)
    for path, raw_target in links:
        target = raw_target.decode("utf-8", "surrogateescape")
        shown = one_line(path, 120)
        if "\0" in target or target.startswith("/"):
            raise Refused(f"symlink {shown!r} points to the absolute path {one_line(target, 120)!r}, out of the task")
        link = root / path
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, link)
    for path, _ in links:
        resolved = os.path.realpath(root / path)
        if resolved != real_root and not resolved.startswith(real_root + os.sep):
            target = os.readlink(root / path)
            raise Refused(
                f"symlink {one_line(path, 120)!r} points out of the task directory (to {one_line(target, 120)!r})"
            )


def _write_file(source: IO[bytes], size: int, root: Path, name: str, mode: int) -> None:
    """``root/name`` from the next ``size`` bytes of ``source`` (never through a link, never over a file)."""
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    head = source.read(min(size, 1 << 20))
    if len(head) < min(size, 1 << 20):
        raise Refused(f"the content of {one_line(name, 120)!r} ended early")
    if size <= MAX_LFS_POINTER_BYTES and head.startswith(LFS_POINTER):
        raise Refused(f"{one_line(name, 120)!r} is a git-lfs pointer: its content is in git-lfs, which is not fetched")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as out:
        out.write(head)
        left = size - len(head)
        while left:
            chunk = source.read(min(left, 1 << 20))
            if not chunk:
                raise Refused(f"the content of {one_line(name, 120)!r} ended early")
            out.write(chunk)
            left -= len(chunk)
    os.chmod(path, mode)  # the umask does not decide a task's modes
