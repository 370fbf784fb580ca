"""Harbor's dataset registry: which datasets there are, and where each task's files live.

The registry is one JSON file (Harbor's ``registry.json``, read by ``harbor datasets download``):
a list of datasets, each a name, a version, a description and its tasks, each task a name, the
git repository that holds it, a commit of that repository and the task directory's path in it::

    [{"name": "terminal-bench", "version": "2.0", "description": "...",
      "tasks": [{"name": "hello-world", "git_url": "https://github.com/laude-institute/terminal-bench-2.git",
                 "git_commit_id": "0123...", "path": "hello-world"}, ...],
      "metrics": [...]}, ...]

``git_commit_id`` may be missing or null (the repository's default branch, as Harbor reads it) or
a branch or tag name: such a task is looked up again at every pull; a full commit id is fetched
once. ``metrics`` and unknown keys are ignored.

Which registry: ``--registry URL|PATH``, else ``registry = "URL|PATH"`` in
``~/.config/sandrl/datasets.toml`` (``$SANDRL_DATASETS_CONFIG``), else Harbor's public one
(:data:`DEFAULT_REGISTRY`). A registry fetched over HTTP is kept in the cache, and that copy is
used (with a note) when the registry cannot be reached.

Everything in a registry is hostile: :func:`check_task` refuses a task whose path leaves its
repository, whose URL is not a plain network one (:func:`~sandrl.tasks.datasets.git.check_url`),
or whose name would not be one plain directory name in the dataset directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import httpx

from sandrl.errors import ConfigError, TaskError
from sandrl.tasks.datasets.git import check_url, one_line, repository_key
from sandrl.toml_config import read_toml, type_name

__all__ = [
    "DEFAULT_REGISTRY",
    "Dataset",
    "RegistryTask",
    "TaskSource",
    "check_task",
    "default_registry",
    "find_dataset",
    "parse_spec",
    "read_registry",
]

DEFAULT_REGISTRY = "https://raw.githubusercontent.com/laude-institute/harbor/main/registry.json"
"""Harbor's own default (``harbor.constants.DEFAULT_REGISTRY_URL``)."""
CONFIG_ENV = "SANDRL_DATASETS_CONFIG"
CONFIG_FILE = "~/.config/sandrl/datasets.toml"
MAX_REGISTRY_BYTES = 64 << 20
FETCH_TIMEOUT_S = 60.0
MAX_NAME_CHARS = 200

_DATASET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*(?:/[A-Za-z0-9][A-Za-z0-9._+-]*)*$")
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
_DIR_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+@=,-]*$")
_COMMIT = re.compile(r"^(?:[0-9a-fA-F]{40}|[0-9a-fA-F]{64})$")
_REF = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._/-]*$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class RegistryTask:
    """One task entry as the registry wrote it (each field checked by :func:`check_task`)."""

    index: int
    name: object
    git_url: object
    git_commit_id: object
    path: object

    @property
    def label(self) -> str:
        """How messages name it: its name, shown safely, or its place in the list."""
        if isinstance(self.name, str) and self.name.strip():
            return one_line(self.name, 120)
        return f"task #{self.index + 1}"


@dataclass(frozen=True)
class Dataset:
    """One ``name@version`` of a registry; ``tasks`` as listed (unchecked)."""

    name: str
    version: str
    description: str
    tasks: tuple[RegistryTask, ...]

    @property
    def spec(self) -> str:
        return f"{self.name}@{self.version}"


@dataclass(frozen=True)
class TaskSource:
    """A registry task that passed :func:`check_task`: what to fetch and where it goes."""

    label: str
    dir_name: str
    """Its directory in the dataset directory (the last part of its path, as Harbor names it)."""
    url: str
    repository: str
    """:func:`~sandrl.tasks.datasets.git.repository_key` of ``url``: tasks are fetched by it."""
    ref: str
    """A full commit id (lower case), ``HEAD``, or a branch or tag name."""
    path: str
    """Its directory in the repository (``a/b``; ``""`` for the repository's root)."""

    @property
    def pinned(self) -> bool:
        return bool(_COMMIT.match(self.ref))


def parse_spec(spec: str) -> tuple[str, str | None]:
    """``NAME@VERSION`` (or ``NAME``) as a pair; a name or version that could not be a plain
    directory name is a :class:`ConfigError`."""
    name, at, version = spec.strip().rpartition("@")
    if not at:
        name, version = version, ""
    if not _DATASET_NAME.match(name) or len(name) > MAX_NAME_CHARS:
        raise ConfigError(
            f"{one_line(spec, 120)!r} is not NAME@VERSION: a dataset name is letters, digits and . _ + - "
            "(parts separated by /), e.g. terminal-bench@2.0"
        )
    if at and (not _VERSION.match(version) or len(version) > MAX_NAME_CHARS):
        raise ConfigError(f"{one_line(spec, 120)!r}: the version must be letters, digits and . _ + -, e.g. 2.0")
    return name, version or None


def default_registry() -> str:
    """``registry`` in the datasets config (``$SANDRL_DATASETS_CONFIG``, default
    ``~/.config/sandrl/datasets.toml``; a relative path is the file's), else Harbor's registry."""
    file = Path(os.environ.get(CONFIG_ENV) or os.path.expanduser(CONFIG_FILE))
    if not file.is_file():
        return DEFAULT_REGISTRY
    config = read_toml(file)
    unknown = sorted(set(config) - {"registry"})
    if unknown:
        raise ConfigError(f"{file}: unknown key {unknown[0]!r}; the datasets config has one key, registry")
    registry = config.get("registry", DEFAULT_REGISTRY)
    if not isinstance(registry, str) or not registry.strip():
        raise ConfigError(f"{file}: registry must be a URL or a path, got {type_name(registry)}")
    if not _is_url(registry):
        registry = str((file.parent / os.path.expanduser(registry)).resolve())
    return registry


def _is_url(source: str) -> bool:
    return source.startswith(("https://", "http://"))


def read_registry(source: str, cache_dir: Path) -> tuple[list[Any], str | None]:
    """The registry's datasets (as JSON values) and a note to show, if any.

    ``source`` is an ``https://``/``http://`` URL or a file. A URL's answer is kept under
    ``cache_dir``; when the URL cannot be had, that copy is used and the note says so.
    """
    if not _is_url(source):
        path = Path(source).expanduser()
        try:
            with path.open("rb") as f:
                body = f.read(MAX_REGISTRY_BYTES + 1)
        except OSError as exc:
            raise ConfigError(
                f"cannot read the registry {source}: {exc.strerror or exc}; "
                "give a registry.json path or an https:// URL"
            ) from exc
        return _datasets(body, source), None
    copy = cache_dir / "registries" / (hashlib.sha256(source.encode()).hexdigest()[:32] + ".json")
    try:
        body = _download(source)
        datasets = _datasets(body, source)
    except TaskError as exc:
        if not copy.is_file():
            raise
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(copy.stat().st_mtime))
        return _datasets(copy.read_bytes(), str(copy)), f"{exc}; using the copy fetched {when}"
    copy.parent.mkdir(parents=True, exist_ok=True)
    partial = copy.with_suffix(f".{os.getpid()}.part")
    partial.write_bytes(body)
    partial.replace(copy)
    return datasets, None


def _download(url: str) -> bytes:
    host = urlsplit(url).hostname or ""
    loopback = host in ("localhost", "::1") or host.startswith("127.")
    try:
        with (
            httpx.Client(
                timeout=FETCH_TIMEOUT_S, follow_redirects=True, max_redirects=5, trust_env=not loopback
            ) as client,
            client.stream("GET", url) as response,
        ):
            if url.startswith("https://") and response.url.scheme != "https":
                raise TaskError(f"the registry {url} redirected to plain http ({response.url}); refused")
            if response.status_code != 200:
                raise TaskError(f"the registry {url} answered HTTP {response.status_code}")
            body = bytearray()
            for chunk in response.iter_bytes():
                body.extend(chunk)
                if len(body) > MAX_REGISTRY_BYTES:
                    raise TaskError(f"the registry {url} is over {MAX_REGISTRY_BYTES >> 20} MiB; refused")
            return bytes(body)
    except httpx.HTTPError as exc:
        raise TaskError(
            f"cannot fetch the registry {url}: {one_line(str(exc) or type(exc).__name__, 200)}; "
            "check the network, or give --registry PATH/registry.json"
        ) from exc


def _datasets(body: bytes, source: str) -> list[Any]:
    if len(body) > MAX_REGISTRY_BYTES:
        raise TaskError(f"the registry {source} is over {MAX_REGISTRY_BYTES >> 20} MiB; refused")
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TaskError(
            f"the registry {source} is not JSON ({exc}); Harbor's registry.json is a list of datasets"
        ) from exc
    if isinstance(data, dict) and isinstance(data.get("datasets"), list):
        data = data["datasets"]
    if not isinstance(data, list):
        raise TaskError(f"the registry {source} is not a list of datasets, as Harbor's registry.json is")
    return data


def find_dataset(datasets: list[Any], name: str, version: str | None, source: str) -> Dataset:
    """The dataset ``name@version`` (``version`` may be left out when there is one); other
    entries are not looked at, so a malformed one elsewhere does not matter."""
    entries = [e for e in datasets if isinstance(e, dict) and e.get("name") == name]
    versions = [str(e.get("version")) for e in entries]
    chosen = [e for e in entries if e.get("version") == version] if version is not None else entries
    if len(chosen) != 1 or not isinstance(chosen[0].get("version"), str):
        if entries and version is None:
            listed = ", ".join(versions[:20])
            raise ConfigError(f"{name} has {len(versions)} versions in {source} ({listed}); name one: {name}@VERSION")
        if entries and not chosen:
            raise ConfigError(f"no version {version!r} of {name} in {source}; it has {', '.join(versions[:20])}")
        if len(chosen) > 1:
            raise TaskError(
                f"{name}@{version} is listed {len(chosen)} times in the registry {source}; fix the registry"
            )
        names = sorted({e["name"] for e in datasets if isinstance(e, dict) and isinstance(e.get("name"), str)})
        shown = ", ".join(one_line(n, 60) for n in names[:15]) + (", ..." if len(names) > 15 else "")
        raise ConfigError(f"no dataset {name!r} in the registry {source}; it has {len(names)}: {shown}")
    entry = chosen[0]
    tasks = entry.get("tasks")
    if not isinstance(tasks, list):
        raise TaskError(f"{name}@{entry['version']} in the registry {source} has no list of tasks")
    description = entry.get("description")
    return Dataset(
        name=name,
        version=entry["version"],
        description=description if isinstance(description, str) else "",
        tasks=tuple(_task(i, t) for i, t in enumerate(tasks)),
    )


def _task(index: int, raw: object) -> RegistryTask:
    if not isinstance(raw, dict):
        return RegistryTask(index, None, None, None, None)
    return RegistryTask(index, raw.get("name"), raw.get("git_url"), raw.get("git_commit_id"), raw.get("path"))


def check_task(task: RegistryTask) -> TaskSource | str:
    """What to fetch for ``task``, or why it is refused (one line naming the field and the fix)."""
    if not isinstance(task.name, str) or not task.name.strip() or _CONTROL.search(task.name):
        return "has no name, or one with control characters"
    url_problem = check_url(task.git_url)
    if url_problem is not None:
        return url_problem
    assert isinstance(task.git_url, str)
    ref = _ref(task.git_commit_id)
    if ref is None:
        shown = one_line(str(task.git_commit_id), 80)
        return f"git_commit_id {shown!r} is neither a full commit id nor a branch or tag name"
    path = _path(task.path)
    if path is None:
        return (
            f"path {one_line(str(task.path), 120)!r} is refused: it must be a relative path inside its "
            "repository (no .., not absolute, no backslash or control character)"
        )
    dir_name = PurePosixPath(path).name if path else task.name.strip()
    if not _DIR_NAME.match(dir_name) or len(dir_name) > MAX_NAME_CHARS:
        return f"{one_line(dir_name, 80)!r} cannot be a directory in the dataset: use letters, digits and . _ + @ = , -"
    return TaskSource(
        label=task.label,
        dir_name=dir_name,
        url=task.git_url,
        repository=repository_key(task.git_url),
        ref=ref,
        path=path,
    )


def _ref(value: object) -> str | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "head")):
        return "HEAD"
    if not isinstance(value, str):
        return None
    value = value.strip()
    if _COMMIT.match(value):
        return value.lower()
    bad = ".." in value or "//" in value or value.endswith(("/", ".lock", "."))
    return value if _REF.match(value) and not bad and len(value) <= 255 else None


def _path(value: object) -> str | None:
    if not isinstance(value, str) or len(value) > 1024 or "\\" in value or _CONTROL.search(value):
        return None
    if value.startswith("/"):
        return None
    parts = [p for p in value.split("/") if p not in ("", ".")]
    if ".." in parts:
        return None
    return "/".join(parts)
