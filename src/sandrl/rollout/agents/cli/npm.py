"""One pinned npm package on this machine: fetched from the registry once, checked, unpacked into sandrl's cache.

A CLI agent ships on npm (Claude Code's native binary in ``@anthropic-ai/claude-code-linux-x64``,
Codex's in ``@openai/codex@<version>-linux-x64``). sandrl does not run ``npm install``: a package's
install scripts are code from the registry, and the task's image may have no node at all. It asks
the registry for the one version it pins (``GET {registry}/{name}/{version}``), downloads that
tarball and unpacks the files it names into ``$SANDRL_CACHE_DIR/cli-agents/<name>-<version>/``,
where every later run finds them.

What the registry sends is hostile input, checked before use:

- the version record is at most :data:`MAX_RECORD_BYTES` of JSON; its tarball must be on the
  registry's own host (a record cannot send the download elsewhere) and over http(s);
- the tarball is at most :data:`MAX_TARBALL_BYTES`, and its ``sha512`` must be the record's
  ``dist.integrity`` (npm's subresource-integrity string), else nothing is unpacked;
- only regular files and directories under ``package/`` are unpacked, never through ``..``, an
  absolute name, a link or a device; each at most :data:`MAX_FILE_BYTES`, all together at most
  :data:`MAX_UNPACKED_BYTES`; permissions are ``0755`` for files the archive marks executable and
  ``0644`` otherwise (no setuid);
- the unpacked tree appears in the cache only once complete (a rename), so a run that died halfway
  leaves nothing a later run would trust.

A version the registry does not have is a :class:`~sandrl.errors.ConfigError` naming the setting
to change; a registry that fails or cannot be reached a :class:`~sandrl.errors.RegistryError`; a
tarball that is not what the record says a :class:`~sandrl.errors.LayerError`.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import posixpath
import re
import shutil
import tarfile
import tempfile
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote, urlsplit

import httpx

from sandrl.cache_dirs import cache_dir
from sandrl.errors import ConfigError, LayerError, RegistryError

DEFAULT_REGISTRY = "https://registry.npmjs.org"
REGISTRY_ENV = "SANDRL_NPM_REGISTRY"
"""Overrides the registry (a mirror), as ``[rollout.cli_agents] registry`` does in a config."""
MAX_RECORD_BYTES = 1 << 20
MAX_TARBALL_BYTES = 1 << 30
MAX_FILE_BYTES = 1 << 30
MAX_UNPACKED_BYTES = 2 << 30
CACHE_NAME = "cli-agents"
_COMPLETE = ".sandrl-complete"
_NAME = re.compile(r"^(@[a-z0-9][a-z0-9._-]*/)?[a-z0-9][a-z0-9._-]*$")
_VERSION = re.compile(r"^[0-9A-Za-z][0-9A-Za-z.+-]{0,99}$")
_CHUNK = 1 << 20


@dataclass(frozen=True)
class NpmPackage:
    """One version of one package, and the registry it comes from."""

    name: str
    version: str
    registry: str = DEFAULT_REGISTRY
    setting: str = ""
    """The config key that pins the version, for messages (``[rollout.cli_agents] claude_code``)."""

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ConfigError(f"{self.name!r} is not an npm package name")
        if not _VERSION.match(self.version):
            where = f" ({self.setting})" if self.setting else ""
            raise ConfigError(f"{self.version!r} is not a version of {self.name}{where}: give one like 1.2.3")
        parts = urlsplit(self.registry)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"the npm registry must be an http(s) URL, got {self.registry!r}")

    @property
    def spec(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def record_url(self) -> str:
        return f"{self.registry.rstrip('/')}/{quote(self.name, safe='@')}/{quote(self.version, safe='')}"

    def cache_path(self, wanted: Sequence[str]) -> Path:
        """Where the files ``wanted`` of the package live, unpacked (``package/`` under it, as in the tarball)."""
        safe = self.name.lstrip("@").replace("/", "+")
        taken = hashlib.sha256(json.dumps(sorted(wanted)).encode()).hexdigest()[:8]
        return cache_dir(CACHE_NAME) / "npm" / f"{safe}-{self.version}-{taken}"


def registry_url(configured: str = "") -> str:
    """The registry to fetch from: ``configured`` (a config's), else ``$SANDRL_NPM_REGISTRY``, else npm's."""
    return configured or os.environ.get(REGISTRY_ENV) or DEFAULT_REGISTRY


async def fetch_package(
    package: NpmPackage,
    wanted: Sequence[str],
    *,
    on_bytes: Callable[[int], None] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> Path:
    """The unpacked ``package`` (its ``package/`` directory) with at least the files ``wanted``
    (paths under ``package/``; a directory name takes everything under it): from the cache, else
    fetched now. ``on_bytes`` hears each chunk downloaded."""
    root = package.cache_path(wanted)
    if (root / _COMPLETE).is_file():
        return root / "package"
    async with httpx.AsyncClient(timeout=httpx.Timeout(60.0, connect=15.0), transport=transport) as http:
        record = await _record(http, package)
        tarball, integrity = _dist(record, package)
        root.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".fetch-", dir=root.parent) as tmp:
            archive = Path(tmp) / "package.tgz"
            await _download(http, package, tarball, integrity, archive, on_bytes)
            staged = Path(tmp) / "tree"
            unpack(archive, staged, wanted, package.spec)
            (staged / _COMPLETE).write_text(json.dumps({"spec": package.spec, "integrity": integrity}))
            try:
                os.rename(staged, root)
            except OSError:
                if not (root / _COMPLETE).is_file():  # not another process's complete copy: a real failure
                    raise
    return root / "package"


async def _record(http: httpx.AsyncClient, package: NpmPackage) -> dict[str, Any]:
    try:
        async with http.stream("GET", package.record_url, headers={"accept": "application/json"}) as response:
            if response.status_code == 404:
                raise ConfigError(
                    f"the npm registry {package.registry} has no {package.spec}: set "
                    f"{package.setting or 'the version'} to a published version (npm view {package.name} versions)"
                )
            if response.status_code != 200:
                raise RegistryError(
                    f"the npm registry {package.registry} answered {response.status_code} for {package.spec}; "
                    "try again, or point [rollout.cli_agents] registry at a mirror"
                )
            body = await _bounded(response, MAX_RECORD_BYTES, f"the registry's record of {package.spec}")
    except httpx.HTTPError as exc:
        raise RegistryError(
            f"cannot reach the npm registry {package.registry} for {package.spec} ({exc!r}); check the network, or "
            f"point [rollout.cli_agents] registry (or ${REGISTRY_ENV}) at a mirror"
        ) from exc
    try:
        record = json.loads(body)
    except ValueError as exc:
        raise RegistryError(f"the npm registry's record of {package.spec} is not JSON") from exc
    if not isinstance(record, dict):
        raise RegistryError(f"the npm registry's record of {package.spec} is not a JSON object")
    return record


def _dist(record: dict[str, Any], package: NpmPackage) -> tuple[str, str]:
    """The tarball's URL and sha512 integrity the record gives, checked."""
    dist = record.get("dist")
    if record.get("version") != package.version or not isinstance(dist, dict):
        raise RegistryError(f"the npm registry's record of {package.spec} names no such version or no dist")
    tarball, integrity = dist.get("tarball"), dist.get("integrity")
    if not isinstance(tarball, str) or not isinstance(integrity, str):
        raise RegistryError(f"the npm registry's record of {package.spec} has no tarball URL and integrity")
    where, registry = urlsplit(tarball), urlsplit(package.registry)
    if where.scheme not in ("http", "https") or where.hostname != registry.hostname:
        raise LayerError(
            f"the npm registry's record of {package.spec} sends its tarball to {tarball!r}, off the registry's "
            f"host {registry.hostname}: refused"
        )
    sha512 = [item[len("sha512-") :] for item in integrity.split() if item.startswith("sha512-")]
    if not sha512:
        raise RegistryError(f"the npm registry gives {package.spec} no sha512 integrity ({integrity!r}): refused")
    return tarball, sha512[0]


async def _download(
    http: httpx.AsyncClient,
    package: NpmPackage,
    url: str,
    sha512_b64: str,
    dest: Path,
    on_bytes: Callable[[int], None] | None,
) -> None:
    digest = hashlib.sha512()
    size = 0
    try:
        async with http.stream("GET", url, follow_redirects=False) as response:
            if response.status_code != 200:
                raise RegistryError(
                    f"the npm registry answered {response.status_code} for the tarball of {package.spec}"
                )
            with open(dest, "wb") as out:
                async for chunk in response.aiter_bytes(_CHUNK):
                    size += len(chunk)
                    if size > MAX_TARBALL_BYTES:
                        raise LayerError(
                            f"the tarball of {package.spec} is over {MAX_TARBALL_BYTES >> 20} MiB: refused"
                        )
                    digest.update(chunk)
                    out.write(chunk)
                    if on_bytes is not None:
                        on_bytes(len(chunk))
    except httpx.HTTPError as exc:
        raise RegistryError(f"the download of {package.spec} from {url} failed ({exc!r}); try again") from exc
    if base64.b64encode(digest.digest()).decode() != sha512_b64:
        raise LayerError(f"the tarball of {package.spec} does not match the registry's sha512 integrity: refused")


def unpack(archive: Path, dest: Path, wanted: Sequence[str], spec: str) -> None:
    """The files ``wanted`` (under ``package/``; a directory takes its whole subtree) of the npm
    tarball ``archive`` into ``dest/package/``, checked as the module says."""
    prefixes = [w.strip("/") for w in wanted]
    found: set[str] = set()
    total = 0
    dest.mkdir(mode=0o755)
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar:
                rel = _member_path(member.name, spec)
                if rel is None:
                    continue
                hit = next((p for p in prefixes if rel == p or rel.startswith(p + "/")), None)
                if hit is None:
                    continue
                if member.isdir():
                    continue  # made as the files under it need them
                if not member.isreg():
                    raise LayerError(f"{spec}: {member.name} is a link or a special file: refused")
                if member.size > MAX_FILE_BYTES or total + member.size > MAX_UNPACKED_BYTES:
                    raise LayerError(f"{spec}: unpacking {member.name} goes over the bound on what a package holds")
                total += member.size
                target = dest / "package" / rel
                target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
                source = tar.extractfile(member)
                assert source is not None  # a regular file
                with source, open(target, "xb") as out:
                    _copy_exact(source, out, member.size, f"{spec}: {member.name}")
                os.chmod(target, 0o755 if member.mode & 0o111 else 0o644)
                found.add(hit)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise LayerError(f"{spec}: its tarball cannot be unpacked ({exc})") from exc
    missing = [p for p in prefixes if p not in found]
    if missing:
        raise LayerError(f"{spec} has no {', '.join(missing)}: is this the package sandrl expects for this agent?")


def _member_path(name: str, spec: str) -> str | None:
    """``name`` relative to ``package/``; None for a member outside it. Refuses names that climb out."""
    if name.startswith("/") or "\\" in name or "\0" in name:
        raise LayerError(f"{spec}: the tarball holds the unsafe name {name!r}: refused")
    norm = posixpath.normpath(name)
    if norm == ".." or norm.startswith("../"):
        raise LayerError(f"{spec}: the tarball holds the unsafe name {name!r}: refused")
    head, _, rel = norm.partition("/")
    if head != "package" or not rel:
        return None
    return rel


def _copy_exact(source: IO[bytes], out: IO[bytes], size: int, what: str) -> None:
    left = size
    while left > 0:
        chunk = source.read(min(_CHUNK, left))
        if not chunk:
            raise LayerError(f"{what} ends before its stated size")
        out.write(chunk)
        left -= len(chunk)


async def _bounded(response: httpx.Response, limit: int, what: str) -> bytes:
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > limit:
            raise RegistryError(f"{what} is over {limit} bytes: refused")
    return bytes(body)


def remove_cached(package: NpmPackage, wanted: Sequence[str]) -> None:
    """Forget ``package``'s unpacked copy of ``wanted`` (the next fetch downloads it again)."""
    root = package.cache_path(wanted)
    trash = root.with_name(f".trash-{uuid.uuid4().hex}")
    with contextlib.suppress(FileNotFoundError):
        os.rename(root, trash)
        shutil.rmtree(trash, ignore_errors=True)
