"""Write OCI image layouts (``oci-layout``, ``index.json``, ``blobs/sha256/...``) from Python, with no tool.

For tests and benchmarks: a layer is a list of tar entries (files, directories, symlinks, hard links,
whiteouts, or any raw ``TarInfo``, hostile ones included) or a directory tree; an image is layers plus
a config; an index groups images of several platforms. ``skopeo copy oci:DIR:TAG docker://...`` then
pushes the layout to a real registry (:meth:`sandrl.images.local_registry.LocalRegistry.push`).

Output is deterministic: every mtime is fixed unless given, owners are numeric only, gzip headers
carry no name or time, JSON is written in one fixed form. The same inputs give the same digests.
"""

from __future__ import annotations

import copy
import gzip
import hashlib
import io
import json
import os
import random
import re
import stat
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

import zstandard

from sandrl.errors import ConfigError
from sandrl.images.manifest import Descriptor, ImageConfig

Compression = Literal["gzip", "zstd", "none"]

LAYER_MEDIA_TYPES: dict[Compression, str] = {
    "gzip": "application/vnd.oci.image.layer.v1.tar+gzip",
    "zstd": "application/vnd.oci.image.layer.v1.tar+zstd",
    "none": "application/vnd.oci.image.layer.v1.tar",
}
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
REF_NAME = "org.opencontainers.image.ref.name"
"""The annotation by which ``index.json`` names a tag (what ``oci:DIR:TAG`` looks up)."""

FIXED_MTIME = 1_600_000_000
"""The mtime of every entry that is not given one: not 0, so a test can tell that mtimes were applied."""
CREATED = "2020-09-13T12:26:40Z"
"""The ``created`` time of configs and history, FIXED_MTIME as RFC 3339."""
_T = TypeVar("_T")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
"""A registry's tag grammar: what the layout is tagged with is what it is pushed as."""


@dataclass(frozen=True)
class TarEntry:
    """A member of a layer tar: its header and, for a regular file, its content (bytes, or a file read when written)."""

    info: tarfile.TarInfo
    data: bytes | None = None
    source: Path | None = None


def _info(path: str, kind: bytes, mode: int, uid: int, gid: int, mtime: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(path.lstrip("/"))
    info.type = kind
    info.mode = mode
    info.uid, info.gid = uid, gid
    info.mtime = mtime
    return info


def regular_file(
    path: str, content: bytes | str = b"", *, mode: int = 0o644, uid: int = 0, gid: int = 0, mtime: int = FIXED_MTIME
) -> TarEntry:
    data = content.encode() if isinstance(content, str) else content
    info = _info(path, tarfile.REGTYPE, mode, uid, gid, mtime)
    info.size = len(data)
    return TarEntry(info, data)


def directory(path: str, *, mode: int = 0o755, uid: int = 0, gid: int = 0, mtime: int = FIXED_MTIME) -> TarEntry:
    return TarEntry(_info(path.rstrip("/"), tarfile.DIRTYPE, mode, uid, gid, mtime))


def symlink(path: str, target: str, *, uid: int = 0, gid: int = 0, mtime: int = FIXED_MTIME) -> TarEntry:
    info = _info(path, tarfile.SYMTYPE, 0o777, uid, gid, mtime)
    info.linkname = target
    return TarEntry(info)


def hardlink(path: str, target: str, *, mtime: int = FIXED_MTIME) -> TarEntry:
    """``path`` is another name of ``target``, a file earlier in the same layer (a path in the layer, not the host)."""
    info = _info(path, tarfile.LNKTYPE, 0o644, 0, 0, mtime)
    info.linkname = target.lstrip("/")
    return TarEntry(info)


def whiteout(path: str) -> TarEntry:
    """Deletes ``path`` (from the layers below) when the layers are applied in order: ``dir/.wh.name``."""
    parent, _, name = path.strip("/").rpartition("/")
    return regular_file(f"{parent}/.wh.{name}" if parent else f".wh.{name}", mode=0o600)


def opaque_whiteout(path: str) -> TarEntry:
    """Hides everything the layers below put in directory ``path``; what this layer puts there stays."""
    return regular_file(f"{path.strip('/')}/.wh..wh..opq", mode=0o600)


def raw_entry(info: tarfile.TarInfo, data: bytes | None = None) -> TarEntry:
    """An entry exactly as given (``../../etc/x``, an absolute path, a device...), for hostile tests.

    The name is not touched; only the size is set to that of ``data``, so that the tar itself stays well formed.
    """
    info = copy.copy(info)
    if data is not None:
        info.size = len(data)
    return TarEntry(info, data)


def tree_entries(
    root: Path, *, prefix: str = "", mtime: int | None = FIXED_MTIME, uid: int | None = 0, gid: int | None = 0
) -> Iterator[TarEntry]:
    """The entries of the directory tree under ``root`` (not ``root`` itself), in sorted order, read lazily.

    Files sharing an inode become hard links to the first of them. ``mtime``/``uid``/``gid`` of None keep
    the host's; the defaults make the layer independent of when and by whom the tree was written.
    """
    if not root.is_dir():
        raise ConfigError(f"{root} is not a directory: a layer is made from a directory tree")
    seen: dict[tuple[int, int], str] = {}
    base = prefix.strip("/")
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        here = Path(dirpath)
        for name in [*sorted(filenames), *dirnames]:
            path = here / name
            member = "/".join(p for p in (base, path.relative_to(root).as_posix()) if p)
            st = path.lstat()
            when = int(st.st_mtime) if mtime is None else mtime
            owner = st.st_uid if uid is None else uid
            group = st.st_gid if gid is None else gid
            perm = stat.S_IMODE(st.st_mode)
            if stat.S_ISDIR(st.st_mode):
                yield directory(member, mode=perm, uid=owner, gid=group, mtime=when)
            elif stat.S_ISLNK(st.st_mode):
                yield symlink(member, os.readlink(path), uid=owner, gid=group, mtime=when)
            elif stat.S_ISREG(st.st_mode):
                if st.st_nlink > 1 and (st.st_dev, st.st_ino) in seen:
                    yield hardlink(member, seen[st.st_dev, st.st_ino], mtime=when)
                    continue
                seen[st.st_dev, st.st_ino] = member
                info = _info(member, tarfile.REGTYPE, perm, owner, group, when)
                info.size = st.st_size
                yield TarEntry(info, source=path)
            else:
                raise ConfigError(f"{path}: only directories, regular files and symlinks can go into a layer")


class _Sink(Protocol):
    def write(self, b: bytes, /) -> object: ...
    def flush(self) -> object: ...


class _Hashing:
    """Hashes and counts the bytes that pass through it to ``out`` (tarfile and the compressors write here)."""

    def __init__(self, out: _Sink) -> None:
        self._out = out
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, b: bytes, /) -> int:
        self.sha.update(b)
        self.size += len(b)
        self._out.write(b)
        return len(b)

    def flush(self) -> None:
        self._out.flush()

    def tell(self) -> int:
        return self.size

    def read(self, size: int, /) -> bytes:
        raise io.UnsupportedOperation("write only")

    def seek(self, pos: int, /) -> int:
        raise io.UnsupportedOperation("write only")

    def close(self) -> None:
        """The caller closes the real file; tarfile must not."""

    @property
    def digest(self) -> str:
        return "sha256:" + self.sha.hexdigest()


class _Zstd:
    """A zstd stream written to ``out`` as one frame."""

    def __init__(self, out: _Sink) -> None:
        self._out = out
        self._compressor = zstandard.ZstdCompressor(level=3, write_checksum=True).compressobj()

    def write(self, b: bytes, /) -> int:
        self._out.write(self._compressor.compress(b))
        return len(b)

    def flush(self) -> None:
        self._out.flush()

    def close(self) -> None:
        self._out.write(self._compressor.flush())


def _write_tar(entries: Iterable[TarEntry], compression: Compression, out: _Sink) -> _Hashing:
    """Writes the layer blob to ``out``; returns the hash of the tar inside it (the diff_id) and its size."""
    if compression not in LAYER_MEDIA_TYPES:
        raise ConfigError(f"unknown layer compression {compression!r}: use one of {', '.join(LAYER_MEDIA_TYPES)}")
    compressor: gzip.GzipFile | _Zstd | None = None
    if compression == "gzip":
        # filename="" and mtime=0: the gzip header would otherwise carry the output's name and the time.
        compressor = gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=6)
    elif compression == "zstd":
        compressor = _Zstd(out)
    tar = _Hashing(compressor if compressor is not None else out)
    with tarfile.open(fileobj=tar, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for entry in entries:
            info = entry.info
            info.uname = info.gname = ""  # numeric owners only: the host's user names must not leak in
            if entry.source is not None:
                with entry.source.open("rb") as f:
                    archive.addfile(info, f)
            else:
                archive.addfile(info, io.BytesIO(entry.data) if entry.data is not None else None)
    if compressor is not None:
        compressor.close()
    return tar


def layer_blob(entries: Iterable[TarEntry], compression: Compression = "none") -> bytes:
    """A layer blob in memory (for unit tests of an unpacker that need no registry)."""
    out = io.BytesIO()
    _write_tar(entries, compression, out)
    return out.getvalue()


@dataclass(frozen=True)
class LayerSpec:
    """A layer to write: its entries (a generator is consumed once) or a directory tree, and how to compress it."""

    entries: Iterable[TarEntry] | Path
    compression: Compression = "gzip"
    created_by: str = ""


@dataclass(frozen=True)
class Layer:
    """A layer written into a layout."""

    descriptor: Descriptor
    diff_id: str
    """The sha256 of the uncompressed tar, as the config's ``rootfs.diff_ids`` lists it."""
    tar_size: int
    created_by: str = ""

    @property
    def digest(self) -> str:
        return self.descriptor.digest


def config_json(config: ImageConfig, layers: Sequence[Layer]) -> dict[str, Any]:
    """``config`` as the image config blob of an image of ``layers`` holds it."""
    body: dict[str, Any] = {}
    if config.user:
        body["User"] = config.user
    if config.exposed_ports:
        body["ExposedPorts"] = {port: {} for port in config.exposed_ports}
    if config.env:
        body["Env"] = [f"{name}={value}" for name, value in config.env.items()]
    if config.entrypoint is not None:
        body["Entrypoint"] = list(config.entrypoint)
    if config.cmd is not None:
        body["Cmd"] = list(config.cmd)
    if config.healthcheck is not None:
        body["Healthcheck"] = {"Test": list(config.healthcheck)}
    if config.workdir:
        body["WorkingDir"] = config.workdir
    if config.labels:
        body["Labels"] = dict(config.labels)
    body.update(config.extra_config)
    created = config.created or CREATED
    history = (
        [dict(h) for h in config.history]
        if config.history is not None
        else [{"created": created, "created_by": layer.created_by or "sandrl oci_layout"} for layer in layers]
    )
    platform = config.platform
    out: dict[str, Any] = {"created": created, "architecture": platform.architecture, "os": platform.os}
    if platform.variant:
        out["variant"] = platform.variant
    out["config"] = body
    out["rootfs"] = {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]}
    out["history"] = history
    return out


def _json_bytes(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


class OCILayout:
    """An OCI image layout directory, created if absent; what ``index.json`` already tags is kept."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.blobs = root / "blobs" / "sha256"
        self.blobs.mkdir(parents=True, exist_ok=True)
        marker = root / "oci-layout"
        if not marker.exists():
            marker.write_bytes(_json_bytes({"imageLayoutVersion": "1.0.0"}))
        self._refs: list[dict[str, Any]] = []
        index = root / "index.json"
        if index.exists():
            self._refs = list(json.loads(index.read_text()).get("manifests", []))
        else:
            self._write_index()

    def blob_path(self, digest: str) -> Path:
        algorithm, _, hexdigest = digest.partition(":")
        if algorithm != "sha256" or len(hexdigest) != 64:
            raise ConfigError(f"{digest!r} is not a sha256 digest")
        return self.blobs / hexdigest

    def read_blob(self, digest: str) -> bytes:
        return self.blob_path(digest).read_bytes()

    def _store(self, write: Callable[[_Hashing], _T]) -> tuple[Descriptor, _T]:
        """Runs ``write`` into a temporary file, then files it under the digest of what was written."""
        fd, tmp = tempfile.mkstemp(dir=self.blobs, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                hashing = _Hashing(f)
                result = write(hashing)
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.blob_path(hashing.digest))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return Descriptor("application/octet-stream", hashing.digest, hashing.size), result

    def write_blob(self, data: bytes, media_type: str = "application/octet-stream") -> Descriptor:
        desc, _ = self._store(lambda out: out.write(data))
        return Descriptor(media_type, desc.digest, desc.size)

    def write_json(self, obj: Any, media_type: str) -> Descriptor:
        return self.write_blob(_json_bytes(obj), media_type)

    def add_layer(self, layer: LayerSpec | Iterable[TarEntry], compression: Compression | None = None) -> Layer:
        spec = layer if isinstance(layer, LayerSpec) else LayerSpec(layer)
        kind = compression or spec.compression
        entries = tree_entries(spec.entries) if isinstance(spec.entries, Path) else spec.entries
        desc, tar = self._store(lambda out: _write_tar(entries, kind, out))
        return Layer(Descriptor(LAYER_MEDIA_TYPES[kind], desc.digest, desc.size), tar.digest, tar.size, spec.created_by)

    def add_image(
        self,
        layers: Sequence[Layer | LayerSpec],
        config: ImageConfig | None = None,
        *,
        tag: str | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> Descriptor:
        """Writes the config and the manifest; returns the manifest's descriptor (with its platform, for an index)."""
        config = config or ImageConfig()
        written = [layer if isinstance(layer, Layer) else self.add_layer(layer) for layer in layers]
        config_desc = self.write_json(config_json(config, written), CONFIG_MEDIA_TYPE)
        manifest: dict[str, Any] = {
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPE,
            "config": config_desc.to_json(),
            "layers": [layer.descriptor.to_json() for layer in written],
        }
        if annotations:
            manifest["annotations"] = dict(annotations)
        desc = self.write_json(manifest, MANIFEST_MEDIA_TYPE)
        desc = Descriptor(desc.media_type, desc.digest, desc.size, platform=config.platform)
        if tag is not None:
            self.tag(desc, tag)
        return desc

    def add_index(
        self, manifests: Sequence[Descriptor], *, tag: str | None = None, annotations: Mapping[str, str] | None = None
    ) -> Descriptor:
        """An image index of ``manifests`` (each with its platform): a multi-platform image."""
        index: dict[str, Any] = {
            "schemaVersion": 2,
            "mediaType": INDEX_MEDIA_TYPE,
            "manifests": [m.to_json() for m in manifests],
        }
        if annotations:
            index["annotations"] = dict(annotations)
        desc = self.write_json(index, INDEX_MEDIA_TYPE)
        if tag is not None:
            self.tag(desc, tag)
        return desc

    def tag(self, descriptor: Descriptor, name: str) -> None:
        """Names ``descriptor`` ``name`` in index.json (what ``oci:DIR:name`` finds), replacing an earlier one."""
        if not _TAG.fullmatch(name):
            raise ConfigError(
                f"{name!r} is not a tag: up to 128 of letters, digits, '_', '.', '-', not starting with '.' or '-'"
            )
        entry = Descriptor(descriptor.media_type, descriptor.digest, descriptor.size, descriptor.platform)
        ref = entry.to_json() | {"annotations": {REF_NAME: name}}
        self._refs = [r for r in self._refs if r.get("annotations", {}).get(REF_NAME) != name] + [ref]
        self._write_index()

    def _write_index(self) -> None:
        index = {"schemaVersion": 2, "mediaType": INDEX_MEDIA_TYPE, "manifests": self._refs}
        tmp = self.root / ".index.json.tmp"
        tmp.write_bytes(_json_bytes(index))
        os.replace(tmp, self.root / "index.json")


def write_rootfs_image(
    layout: Path,
    layer_dirs: Sequence[Path],
    *,
    tag: str,
    config: ImageConfig | None = None,
    compression: Compression = "gzip",
) -> Descriptor:
    """An image whose layers are the host directories ``layer_dirs``, bottom first, tagged ``tag`` in ``layout``."""
    oci = OCILayout(layout)
    specs = [LayerSpec(d, compression, created_by=f"COPY {d.name} /") for d in layer_dirs]
    return oci.add_image(specs, config, tag=tag)


def synthetic_entries(layer: int, files: int, file_size: int, *, seed: int = 0) -> Iterator[TarEntry]:
    """``files`` files of ``file_size`` bytes under ``layer{layer}/dNN/``, generated lazily.

    Half of each file is random and half repeats text, so it compresses about 2:1 as real images do;
    the content depends only on the arguments.
    """
    rng = random.Random(f"{seed}:{layer}")
    text = b"the quick brown fox jumps over the lazy dog; sandrl layer filler line\n"
    yield directory(f"layer{layer}")
    per_dir = 100
    for i in range(files):
        if i % per_dir == 0:
            yield directory(f"layer{layer}/d{i // per_dir:03d}")
        random_part = rng.randbytes(file_size // 2)
        filler = (text * (file_size // len(text) + 1))[: file_size - len(random_part)]
        yield regular_file(f"layer{layer}/d{i // per_dir:03d}/f{i:05d}.bin", random_part + filler)


def write_synthetic_image(
    layout: Path,
    *,
    tag: str,
    layers: int,
    files_per_layer: int,
    file_size: int,
    compression: Compression = "gzip",
    config: ImageConfig | None = None,
    seed: int = 0,
) -> Descriptor:
    """For benchmarks: ``layers`` layers of ``files_per_layer`` files each (see :func:`synthetic_entries`)."""
    if layers < 1 or files_per_layer < 0 or file_size < 0:
        raise ConfigError("a synthetic image needs at least one layer and non-negative file counts and sizes")
    oci = OCILayout(layout)
    specs = [
        LayerSpec(synthetic_entries(n, files_per_layer, file_size, seed=seed), compression, f"synthetic layer {n}")
        for n in range(layers)
    ]
    return oci.add_image(specs, config, tag=tag)
