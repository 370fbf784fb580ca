"""Manifests, indexes and image configs: what a registry says an image is made of.

Both families are read: OCI (``application/vnd.oci.image.*``) and Docker's schema 2
(``application/vnd.docker.distribution.manifest.*``). An index (a manifest list) names one
manifest per platform; :func:`select_platform` picks the host's, or the one asked for.
"""

from __future__ import annotations

import json
import platform as host_platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sandrl.errors import ConfigError, LayerError, RegistryError

__all__ = [
    "ACCEPT",
    "DEFAULT_PATH",
    "Descriptor",
    "ImageConfig",
    "Manifest",
    "Platform",
    "host_platform_of",
    "parse_config",
    "parse_manifest",
    "select_platform",
]

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)
ACCEPT = ", ".join((*INDEX_TYPES, *MANIFEST_TYPES))
LAYER_TYPES = {
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
}
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""Docker's ``PATH`` for an image whose config sets none (and for what sandrl runs in a sandbox)."""
MAX_MANIFEST_BYTES = 4 << 20
"""The distribution registry's own bound on a manifest."""
MAX_CONFIG_BYTES = 16 << 20

_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64", "armv7l": "arm", "armv6l": "arm"}


@dataclass(frozen=True)
class Platform:
    os: str = "linux"
    architecture: str = "amd64"
    variant: str | None = None

    def __str__(self) -> str:
        return "/".join(p for p in (self.os, self.architecture, self.variant) if p)

    def to_json(self) -> dict[str, str]:
        out = {"architecture": self.architecture, "os": self.os}
        if self.variant:
            out["variant"] = self.variant
        return out

    @classmethod
    def parse(cls, text: str) -> Platform:
        parts = text.strip().split("/")
        if len(parts) not in (2, 3) or not all(parts):
            raise ConfigError(
                f"{text!r} is not a platform: write os/arch[/variant], e.g. linux/amd64 or linux/arm64/v8"
            )
        return cls(parts[0], _ARCH.get(parts[1], parts[1]), parts[2] if len(parts) == 3 else None)

    def matches(self, other: Platform) -> bool:
        if (self.os, self.architecture) != (other.os, other.architecture):
            return False
        if self.variant is None or other.variant is None:
            return True
        return self.variant == other.variant


def host_platform_of() -> Platform:
    machine = host_platform.machine().lower()
    arch = _ARCH.get(machine, machine)
    variant = {"armv7l": "v7", "armv6l": "v6"}.get(machine)
    return Platform("linux", arch, variant)


@dataclass(frozen=True)
class Descriptor:
    """A content descriptor: what a manifest, an index or ``index.json`` says of a blob."""

    media_type: str
    digest: str
    size: int
    platform: Platform | None = None
    annotations: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mediaType": self.media_type, "digest": self.digest, "size": self.size}
        if self.platform is not None:
            out["platform"] = self.platform.to_json()
        if self.annotations:
            out["annotations"] = dict(self.annotations)
        return out


@dataclass(frozen=True)
class Manifest:
    media_type: str
    config: Descriptor | None = None
    layers: tuple[Descriptor, ...] = ()
    """Bottom first, as the manifest lists them."""
    manifests: tuple[Descriptor, ...] = ()
    """Of an index: one per platform."""

    @property
    def is_index(self) -> bool:
        return self.media_type in INDEX_TYPES


@dataclass(frozen=True)
class ImageConfig:
    """An image's config: what ``docker run`` takes from it. :func:`parse_config` reads one from a
    registry; :class:`~sandrl.images.oci_layout.OCILayout` writes one into a layout."""

    env: dict[str, str] = field(default_factory=lambda: {"PATH": DEFAULT_PATH})
    """Docker's default ``PATH`` unless given."""
    workdir: str | None = None
    user: str | None = None
    entrypoint: Sequence[str] | None = None
    cmd: Sequence[str] | None = None
    exposed_ports: Sequence[str] = ()
    healthcheck: Sequence[str] | None = None
    """``Healthcheck.Test``: ``("CMD", ...)`` or ``("CMD-SHELL", command)``."""
    diff_ids: tuple[str, ...] = ()
    """Of a config read: ``rootfs.diff_ids`` (a written config lists its layers' own)."""
    platform: Platform = field(default_factory=Platform)
    labels: Mapping[str, str] = field(default_factory=dict)
    extra_config: Mapping[str, Any] = field(default_factory=dict)
    """Written into the ``config`` object as given (Volumes, StopSignal...)."""
    history: Sequence[Mapping[str, Any]] | None = None
    """Explicit history entries to write; by default one per layer, ``created_by`` taken from the layer."""
    created: str | None = None
    """RFC 3339; a written config without one has a fixed time (its digest depends on nothing else)."""

    def to_record(self) -> dict[str, object]:
        """The runtime part, as the image store keeps it."""
        return {
            "user": self.user,
            "entrypoint": list(self.entrypoint) if self.entrypoint is not None else None,
            "cmd": list(self.cmd) if self.cmd is not None else None,
            "exposed_ports": list(self.exposed_ports),
            "healthcheck": list(self.healthcheck) if self.healthcheck is not None else None,
            "platform": str(self.platform),
        }


def _descriptor(raw: object, where: str) -> Descriptor:
    if not isinstance(raw, dict):
        raise LayerError(f"{where}: a descriptor is not an object")
    media, digest, size = raw.get("mediaType"), raw.get("digest"), raw.get("size")
    if not isinstance(digest, str) or not digest.startswith(("sha256:", "sha512:")):
        raise LayerError(f"{where}: a descriptor has no usable digest ({digest!r})")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise LayerError(f"{where}: the descriptor of {digest} has no valid size")
    plat = raw.get("platform")
    platform = None
    if isinstance(plat, dict):
        variant = plat.get("variant")
        platform = Platform(
            str(plat.get("os", "")), str(plat.get("architecture", "")), str(variant) if variant else None
        )
    return Descriptor(str(media or ""), digest, size, platform)


def parse_manifest(body: bytes, media_type: str, where: str) -> Manifest:
    """A manifest or index; ``media_type`` is the response's (the body's own wins when it has one)."""
    data = _json_object(body, "the manifest", where)
    kind = str(data.get("mediaType") or media_type.split(";")[0].strip())
    if data.get("schemaVersion") == 1 or "signatures" in data:
        raise RegistryError(
            f"{where}: the registry serves only an old schema 1 manifest, which sandrl does not read; "
            "push the image again with a current Docker or skopeo"
        )
    if "manifests" in data and kind not in MANIFEST_TYPES:
        entries = data["manifests"]
        if not isinstance(entries, list):
            raise LayerError(f"{where}: the index's manifests is not a list")
        return Manifest(kind or OCI_INDEX, manifests=tuple(_descriptor(e, where) for e in entries))
    if kind not in MANIFEST_TYPES and not ("layers" in data and "config" in data):
        raise RegistryError(f"{where}: {kind or 'an unknown kind'} is not an image manifest sandrl can read")
    layers = data.get("layers")
    if not isinstance(layers, list):
        raise LayerError(f"{where}: the manifest's layers is not a list")
    parsed = tuple(_descriptor(layer, where) for layer in layers)
    for layer in parsed:
        if layer.media_type and layer.media_type not in LAYER_TYPES:
            raise LayerError(f"{where}: layer {layer.digest} is of the type {layer.media_type}, not a layer tar")
    return Manifest(kind or OCI_MANIFEST, config=_descriptor(data.get("config"), where), layers=parsed)


def select_platform(index: Manifest, wanted: Platform, where: str) -> Descriptor:
    """The manifest of ``index`` for ``wanted`` (attestation manifests, platform unknown/unknown, skipped)."""
    candidates = [m for m in index.manifests if m.platform is not None and m.platform.matches(wanted)]
    if wanted.architecture == "arm64" and len(candidates) > 1:
        candidates.sort(key=lambda m: m.platform is None or m.platform.variant not in (None, "v8"))
    if candidates:
        return candidates[0]
    offered = sorted({str(m.platform) for m in index.manifests if m.platform and m.platform.os != "unknown"})
    raise RegistryError(
        f"{where} has no image for {wanted} (it has: {', '.join(offered) or 'none'}); "
        "choose one with --platform, or use an image built for this machine"
    )


def parse_config(body: bytes, where: str) -> ImageConfig:
    data = _json_object(body, "the image config", where)
    conf = data.get("config") or {}
    if not isinstance(conf, dict):
        raise LayerError(f"{where}: the image config's config is not an object")
    env: dict[str, str] = {}
    for item in conf.get("Env") or []:
        if isinstance(item, str):
            key, _, value = item.partition("=")
            if key:
                env[key] = value
    rootfs = data.get("rootfs") or {}
    diff_ids = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
    if not isinstance(diff_ids, list) or not all(isinstance(d, str) for d in diff_ids):
        raise LayerError(f"{where}: the image config has no rootfs.diff_ids list")
    health = conf.get("Healthcheck")
    test = health.get("Test") if isinstance(health, dict) else None
    variant = data.get("variant")
    labels = conf.get("Labels")
    created = data.get("created")
    return ImageConfig(
        env=env,
        workdir=str(conf["WorkingDir"]) if conf.get("WorkingDir") else None,
        user=str(conf["User"]) if conf.get("User") else None,
        entrypoint=_strings(conf.get("Entrypoint")),
        cmd=_strings(conf.get("Cmd")),
        exposed_ports=tuple(sorted(conf.get("ExposedPorts") or {})),
        healthcheck=_strings(test) if test and test != ["NONE"] else None,
        diff_ids=tuple(diff_ids),
        platform=Platform(str(data.get("os") or "linux"), str(data.get("architecture") or ""), variant or None),
        labels={str(k): v for k, v in labels.items() if isinstance(v, str)} if isinstance(labels, dict) else {},
        created=created if isinstance(created, str) else None,
    )


def _json_object(body: bytes, what: str, where: str) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise LayerError(f"{where}: {what} is not JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise LayerError(f"{where}: {what} is not a JSON object")
    return data


def _strings(value: object) -> tuple[str, ...] | None:
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    if isinstance(value, str):
        return ("/bin/sh", "-c", value)
    return None
