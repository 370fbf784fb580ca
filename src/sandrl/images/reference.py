"""Image references as Docker writes them, and the registries that serve them.

``ubuntu:24.04`` is ``docker.io/library/ubuntu:24.04``; ``ghcr.io/org/img@sha256:...`` names one
manifest by its digest. The grammar is the distribution project's (``reference/regexp.go``): a
first component with a ``.`` or a ``:``, or ``localhost``, is a registry host; anything else is
on Docker Hub, where one-component names live under ``library/``.

Mirrors: ``SANDRL_REGISTRY_MIRRORS="docker.io=http://127.0.0.1:5000,ghcr.io=https://mirror.example"``
(several mirrors of one registry: repeat the registry, they are tried in order), or the same in a
TOML file (``SANDRL_REGISTRIES_CONFIG``, default ``~/.config/sandrl/registries.toml``)::

    [mirrors]
    "docker.io" = ["http://127.0.0.1:5000"]

A mirror keeps the repository path: ``docker.io/library/python:3.11-slim`` is fetched from
``<mirror>/v2/library/python/manifests/3.11-slim``. After the mirrors, the registry itself is
tried. Plain ``http://`` is used only for a mirror named so, or for a registry on loopback.

Delegates (the file only): origins a mirror or registry (by the URL it is reached at) may redirect
blobs to or name as its token service although they are neither its own nor public https (see
:mod:`sandrl.images.destinations`), e.g. a mirror whose blob storage is on a private network::

    [delegates]
    "http://10.0.0.5:5000" = ["http://10.0.0.6:9000"]
    "https://registry.example.com" = ["https://gitlab.example.com"]

A delegate is trusted as its registry is: it also gets the registry's credentials.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from sandrl.errors import ConfigError

__all__ = ["DOCKER_HUB", "REGISTRIES_CONFIG", "Mirrors", "Reference", "endpoints", "parse_reference", "store_name"]

REGISTRIES_CONFIG = "the registries config ($SANDRL_REGISTRIES_CONFIG, default ~/.config/sandrl/registries.toml)"
"""How messages name the file, wherever it is."""

DOCKER_HUB = "docker.io"
DOCKER_HUB_ENDPOINT = "https://registry-1.docker.io"
_HUB_ALIASES = {"docker.io", "index.docker.io", "registry-1.docker.io", "registry.hub.docker.com"}
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*"
_PATH = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
_LABEL = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_HOST = re.compile(rf"^(?:{_LABEL}(?:\.{_LABEL})*|\[[0-9a-fA-F:.]+\])(?::[0-9]+)?$")
_TAG = re.compile(r"^[\w][\w.-]{0,127}$")
_UNSAFE = re.compile(r"[^a-z0-9._-]+")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$|^sha512:[0-9a-f]{128}$")


@dataclass(frozen=True)
class Reference:
    """One image reference, normalized: ``registry/repository[:tag][@digest]``."""

    registry: str
    """``docker.io``, ``ghcr.io``, ``127.0.0.1:5000``..."""
    repository: str
    """The path under the registry: ``library/ubuntu``, ``laude-institute/t-bench/python-3-13``."""
    tag: str | None = None
    digest: str | None = None
    """``sha256:<hex>``: the manifest (or index) is checked against it."""

    def __str__(self) -> str:
        out = f"{self.registry}/{self.repository}"
        if self.tag is not None:
            out += f":{self.tag}"
        if self.digest is not None:
            out += f"@{self.digest}"
        return out

    @property
    def familiar(self) -> str:
        """As people write it: ``ubuntu:24.04`` rather than ``docker.io/library/ubuntu:24.04``."""
        text = str(self)
        if self.registry == DOCKER_HUB:
            text = text.removeprefix("docker.io/").removeprefix("library/")
        return text

    @property
    def manifest_ref(self) -> str:
        """What goes after ``/manifests/``: the digest when there is one, else the tag."""
        return self.digest or self.tag or "latest"

    def with_digest(self, digest: str) -> Reference:
        return Reference(self.registry, self.repository, self.tag, digest)


def parse_reference(text: str) -> Reference:
    """``text`` as a :class:`Reference`; a :class:`~sandrl.errors.ConfigError` saying what is wrong."""
    raw = text.strip()
    if not raw or any(c.isspace() for c in raw):
        raise ConfigError(f"{text!r} is not an image reference (write name[:tag][@digest], e.g. ubuntu:24.04)")
    name, _, digest = raw.partition("@")
    if digest and not _DIGEST.match(digest):
        raise ConfigError(f"{text!r}: {digest!r} is not a digest (sha256:<64 hex digits>)")
    tag: str | None = None
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name, _, tag = name.rpartition(":")
        if not _TAG.match(tag):
            raise ConfigError(f"{text!r}: {tag!r} is not a valid tag (letters, digits, '_', '.', '-'; at most 128)")
    first, sep, rest = name.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost" or first.startswith("[")):
        registry, path = first, rest
        if not _HOST.match(registry):
            raise ConfigError(f"{text!r}: {registry!r} is not a registry host")
    else:
        registry, path = DOCKER_HUB, name
    if registry.lower() in _HUB_ALIASES:
        registry = DOCKER_HUB
    if registry == DOCKER_HUB and "/" not in path:
        path = f"library/{path}"
    if not _PATH.match(path):
        hint = " (repository names are lower case)" if path != path.lower() else ""
        raise ConfigError(f"{text!r}: {path!r} is not a valid repository path{hint}")
    if tag is None and not digest:
        tag = "latest"
    return Reference(registry=registry, repository=path, tag=tag, digest=digest or None)


def is_loopback(host: str) -> bool:
    """``host`` (with or without a port) is this machine: ``localhost``, ``127.0.0.0/8``, ``[::1]``."""
    name = urlsplit(f"//{host}").hostname or ""
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Mirrors:
    """Registry host → mirror base URLs, tried in order before the registry itself; and the
    delegates of mirrors and registries (endpoint URL → origins)."""

    table: dict[str, tuple[str, ...]] = field(default_factory=dict)
    delegates: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str, *, where: str = "SANDRL_REGISTRY_MIRRORS") -> Mirrors:
        table: dict[str, list[str]] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            registry, sep, url = item.partition("=")
            if not sep or not registry.strip() or not url.strip():
                raise ConfigError(f"{where}: {item!r} is not registry=URL (e.g. docker.io=http://127.0.0.1:5000)")
            table.setdefault(_registry_key(registry.strip()), []).append(_mirror_url(url.strip(), where))
        return cls({k: tuple(v) for k, v in table.items()})

    @classmethod
    def from_file(cls, path: Path) -> Mirrors:
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{path}: cannot read the registries config ({exc})") from exc
        mirrors = data.get("mirrors", {})
        if not isinstance(mirrors, dict):
            raise ConfigError(f"{path}: [mirrors] must be a table of registry = [URL, ...]")
        table: dict[str, tuple[str, ...]] = {}
        for registry, urls in mirrors.items():
            listed = [urls] if isinstance(urls, str) else urls
            if not isinstance(listed, list) or not all(isinstance(u, str) for u in listed):
                raise ConfigError(f"{path}: mirrors.{registry} must be a URL or a list of URLs")
            table[_registry_key(registry)] = tuple(_mirror_url(u, str(path)) for u in listed)
        return cls(table, _delegates(data.get("delegates", {}), path))

    @classmethod
    def from_environment(cls) -> Mirrors:
        """The file's mirrors, then ``SANDRL_REGISTRY_MIRRORS``'s (tried first)."""
        config = os.environ.get("SANDRL_REGISTRIES_CONFIG")
        path = Path(config) if config else Path.home() / ".config" / "sandrl" / "registries.toml"
        merged: dict[str, tuple[str, ...]] = {}
        delegates: dict[str, tuple[str, ...]] = {}
        if path.is_file() or config:
            from_file = cls.from_file(path)
            merged.update(from_file.table)
            delegates = from_file.delegates
        env = cls.parse(os.environ.get("SANDRL_REGISTRY_MIRRORS", ""))
        for registry, urls in env.table.items():
            merged[registry] = urls + tuple(u for u in merged.get(registry, ()) if u not in urls)
        return cls(merged, delegates)

    def for_registry(self, registry: str) -> tuple[str, ...]:
        return self.table.get(registry, ())

    def delegates_of(self, endpoint: str) -> tuple[str, ...]:
        """The origins ``endpoint`` (a mirror's URL, or ``https://HOST`` of a registry) may send the client to."""
        return self.delegates.get(endpoint.rstrip("/"), ())


def _registry_key(registry: str) -> str:
    return DOCKER_HUB if registry.lower() in _HUB_ALIASES else registry


def _mirror_url(url: str, where: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"{where}: mirror {url!r} must be an http:// or https:// URL")
    return url.rstrip("/")


def _delegates(section: object, path: Path) -> dict[str, tuple[str, ...]]:
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: [delegates] must be a table of endpoint URL = [origin URL, ...]")
    table: dict[str, tuple[str, ...]] = {}
    for endpoint, origins in section.items():
        listed = [origins] if isinstance(origins, str) else origins
        if not isinstance(listed, list) or not all(isinstance(o, str) for o in listed):
            raise ConfigError(f"{path}: delegates.{endpoint} must be an origin URL or a list of them")
        where = f"{path} [delegates]"
        table[_mirror_url(endpoint, where)] = tuple(_mirror_url(o, where) for o in listed)
    return table


def endpoints(ref: Reference, mirrors: Mirrors) -> list[str]:
    """Base URLs to try for ``ref``'s registry, in order: its mirrors, then the registry itself
    (``https://``, or ``http://`` for a loopback registry)."""
    origin = (
        DOCKER_HUB_ENDPOINT
        if ref.registry == DOCKER_HUB
        else (f"{'http' if is_loopback(ref.registry) else 'https'}://{ref.registry}")
    )
    listed = list(mirrors.for_registry(ref.registry))
    return [*listed, origin] if origin not in listed else listed


def store_name(ref: Reference, platform: object | None = None) -> str:
    """The name an image store gives ``ref`` (for ``platform``, when one was asked for): readable,
    and unique by a hash of the whole reference (``ubuntu:24.04`` → ``ubuntu-24.04-<hash>``).
    The same on every host, so a client can name an image a sandbox host has pulled."""
    key = str(ref) + (f" {platform}" if platform is not None else "")
    readable = _UNSAFE.sub("-", ref.familiar.lower().replace("/", "_").replace(":", "-").replace("@", "-")).strip("-._")
    return f"{readable[:100].rstrip('-._') or 'image'}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"
