"""The image store: read-only root filesystems that sandboxes start from.

An *image* is a stack of read-only layer directories (topmost first). A sandbox mounts
them idmapped and read-only, with its own copy-on-write layer on top, so any number of
sandboxes share one image on disk and none can change it.

Layout under the store's root::

    images/<name>.json     name, layers (ids, topmost first), env, workdir, created; optionally
                           base (an image the layers are stacked on) and config (build metadata)
    layers/<id>/           one layer: a directory tree (for a full image, a whole rootfs)
    host/                  what the built-in ``host`` image needs (skeleton, /etc mask)

The built-in image ``host`` is the host's own ``/usr`` (with ``/bin``, ``/sbin``, ``/lib*``
as on the host) and ``/etc`` minus every file the host's unprivileged users could not read
(``/etc/shadow``, ssh host keys...), which are hidden by overlayfs whiteouts. Nothing else
of the host appears: ``/root``, ``/home``, ``/var``, ``/tmp`` and ``/run`` start empty.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from sandrl.errors import ConfigError, ImageNotFoundError

HOST_IMAGE = "host"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")
_HOST_SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
_SKELETON_DIRS = {
    "etc": 0o755,
    "usr": 0o755,
    "root": 0o700,
    "tmp": 0o1777,
    "workspace": 0o755,
    "var": 0o755,
    "var/tmp": 0o1777,
    "var/log": 0o755,
    "var/cache": 0o755,
    "var/lib": 0o755,
    "home": 0o755,
    "opt": 0o755,
    "srv": 0o755,
    "mnt": 0o755,
    "media": 0o755,
    "run": 0o755,
    "proc": 0o555,
    "dev": 0o755,
    "sys": 0o555,
}


@dataclass(frozen=True)
class MountPlan:
    """What the sandbox helper mounts: idmapped layers, then overlays built from them."""

    layers: tuple[Path, ...]
    overlays: tuple[tuple[str, tuple[int, ...]], ...]
    """(mount point inside the sandbox, indices into ``layers`` topmost first); "/" first."""


def stack_layers(plan: MountPlan, layers: tuple[Path, ...]) -> MountPlan:
    """``plan`` with layer trees (topmost first) stacked on each of its overlays.

    A layer tree holds the changes under every mount point at its own path (``<layer>/usr``
    for the overlay on ``/usr``, as :func:`sandrl.sandbox.export.export_changes` writes it); a
    layer that has nothing under a mount point is left out of that overlay.
    """
    all_layers = list(plan.layers)
    overlays: list[tuple[str, tuple[int, ...]]] = []
    for target, indices in plan.overlays:
        rel = target.strip("/")
        added: list[int] = []
        for layer in layers:
            path = layer / rel if rel else layer
            if path.is_dir() and not path.is_symlink():
                all_layers.append(path)
                added.append(len(all_layers) - 1)
        overlays.append((target, (*added, *indices)))
    return MountPlan(layers=tuple(all_layers), overlays=tuple(overlays))


@dataclass(frozen=True)
class Image:
    name: str
    plan: MountPlan
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    created: float = 0.0


class ImageStore:
    """Images on disk under ``root`` (default ``<state dir>/images``)."""

    def __init__(self, root: Path, *, host_etc: Path = Path("/etc"), host_root: Path = Path("/")) -> None:
        self.root = root
        self.host_etc = host_etc
        self.host_root = host_root
        self._host: Image | None = None

    # -- reading

    def get(self, name: str, *, _depth: int = 0) -> Image:
        if name == HOST_IMAGE:
            return self.host_image()
        meta = self._meta_path(name)
        if not meta.exists():
            known = ", ".join(n for n in self.names() if not n.startswith("build-"))
            raise ImageNotFoundError(
                f"no image named {name!r} in {self.root} (images: {known}); "
                "build one with `sandrl images build` or import a rootfs with ImageStore.add_rootfs"
            )
        data = json.loads(meta.read_text())
        layers = tuple(self.root / "layers" / lid for lid in data["layers"])
        for layer in layers:
            if not layer.is_dir():
                raise ImageNotFoundError(f"image {name!r} is damaged: its layer {layer} is missing; rebuild it")
        base_name = data.get("base")
        if base_name is None:
            plan = MountPlan(layers=layers, overlays=(("/", tuple(range(len(layers)))),))
            env = dict(data.get("env", {}))
            workdir = data.get("workdir")
        else:
            if base_name == name or _depth > 8:
                raise ImageNotFoundError(f"image {name!r} is damaged: its base images form a loop; rebuild it")
            try:
                base = self.get(str(base_name), _depth=_depth + 1)
            except ImageNotFoundError as exc:
                raise ImageNotFoundError(
                    f"image {name!r} is stacked on the image {base_name!r}, which is gone ({exc}); rebuild both"
                ) from exc
            plan = stack_layers(base.plan, layers)
            env = {**base.env, **data.get("env", {})}
            workdir = data.get("workdir") or base.workdir
        return Image(name=name, plan=plan, env=env, workdir=workdir, created=float(data.get("created", 0.0)))

    def meta(self, name: str) -> dict[str, object]:
        """The image's record as stored (``host``: an empty one); raises if there is no such image."""
        if name == HOST_IMAGE:
            return {"name": HOST_IMAGE, "layers": [], "env": dict(self.host_image().env), "workdir": "/workspace"}
        meta = self._meta_path(name)
        if not meta.exists():
            self.get(name)  # raises with the list of images
        data: dict[str, object] = json.loads(meta.read_text())
        return data

    def names(self) -> list[str]:
        found = [HOST_IMAGE]
        images = self.root / "images"
        if images.is_dir():
            found += sorted(p.stem for p in images.glob("*.json"))
        return found

    def exists(self, name: str) -> bool:
        return name == HOST_IMAGE or self._meta_path(name).exists()

    # -- writing

    def add_layer(self, source: Path, *, move: bool = False) -> str:
        """Copy (or move) a directory tree into the store as a new read-only layer; return its id."""
        if not source.is_dir():
            raise ConfigError(f"{source} is not a directory; a layer is a directory tree")
        layers = self.root / "layers"
        layers.mkdir(parents=True, exist_ok=True)
        layer_id = uuid.uuid4().hex
        target = layers / layer_id
        tmp = layers / f".{layer_id}.tmp"
        if move:
            os.rename(source, tmp)
        else:
            shutil.copytree(source, tmp, symlinks=True)
        os.rename(tmp, target)
        return layer_id

    def add_image(
        self,
        name: str,
        layer_ids: list[str],
        *,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        base: str | None = None,
        config: dict[str, object] | None = None,
    ) -> Image:
        """Register an image made of existing layers (topmost first).

        With ``base``, the layers are stacked on that image's mount plan, over each of its
        overlays (see :func:`stack_layers`), and ``env`` adds to the base's environment; without
        it they are a whole root filesystem, one overlay on ``/``. ``config`` is kept as metadata.
        """
        self._check_name(name)
        for lid in layer_ids:
            if not (self.root / "layers" / lid).is_dir():
                raise ConfigError(f"no layer {lid} in {self.root / 'layers'}")
        if base is not None and not self.exists(base):
            raise ImageNotFoundError(f"cannot stack image {name!r} on {base!r}: there is no such image")
        record: dict[str, object] = {
            "name": name,
            "layers": layer_ids,
            "env": env or {},
            "workdir": workdir,
            "created": time.time(),
        }
        if base is not None:
            record["base"] = base
        if config:
            record["config"] = config
        meta = self._meta_path(name)
        meta.parent.mkdir(parents=True, exist_ok=True)
        tmp = meta.with_name(f".{meta.name}.{uuid.uuid4().hex}.tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, meta)
        return self.get(name)

    def add_rootfs(
        self,
        name: str,
        source: Path,
        *,
        move: bool = False,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
    ) -> Image:
        """Import a whole root filesystem directory as the image ``name``."""
        self._check_name(name)
        if not (source / "bin").exists() and not (source / "usr").exists():
            raise ConfigError(f"{source} does not look like a root filesystem (no bin/ or usr/)")
        return self.add_image(name, [self.add_layer(source, move=move)], env=env, workdir=workdir)

    def remove(self, name: str) -> None:
        """Forget an image. Its layers stay until no image uses them (sandboxes may still run on them)."""
        if name == HOST_IMAGE:
            raise ConfigError("the built-in image 'host' cannot be removed")
        meta = self._meta_path(name)
        if not meta.exists():
            raise ImageNotFoundError(f"no image named {name!r} in {self.root}")
        meta.unlink()

    def prune_layers(self) -> list[str]:
        """Delete layers no image refers to; return their ids. Do not run while sandboxes use them."""
        used: set[str] = set()
        for meta in (self.root / "images").glob("*.json"):
            used.update(json.loads(meta.read_text())["layers"])
        removed = []
        layers = self.root / "layers"
        if layers.is_dir():
            for d in layers.iterdir():
                if d.is_dir() and d.name not in used:
                    shutil.rmtree(d)
                    removed.append(d.name)
        return removed

    def _meta_path(self, name: str) -> Path:
        return self.root / "images" / f"{name}.json"

    def _check_name(self, name: str) -> None:
        if not _NAME.match(name) or name == HOST_IMAGE:
            raise ConfigError(
                f"{name!r} is not a usable image name: lower-case letters, digits, '.', '_', '-'; 'host' is built in"
            )

    # -- the built-in host image

    def host_image(self) -> Image:
        if self._host is None:
            self._host = self._prepare_host()
        return self._host

    def _prepare_host(self) -> Image:
        base = self.root / "host"
        base.mkdir(parents=True, exist_ok=True)
        skeleton = self._skeleton(base)
        mask = self._etc_mask(base)
        layers: list[Path] = [skeleton]
        overlays: list[tuple[str, tuple[int, ...]]] = [("/", (0,))]
        for name in _HOST_SYSTEM_DIRS:
            path = self.host_root / name
            if path.is_dir() and not path.is_symlink():
                layers.append(path)
                overlays.append((f"/{name}", (len(layers) - 1,)))
        layers += [mask, self.host_etc]
        overlays.append(("/etc", (len(layers) - 2, len(layers) - 1)))
        return Image(
            name=HOST_IMAGE,
            plan=MountPlan(layers=tuple(layers), overlays=tuple(overlays)),
            env={"PATH": DEFAULT_PATH},
            workdir="/workspace",
        )

    def _skeleton(self, base: Path) -> Path:
        """The top level of the host image: empty directories, and the host's /bin-style symlinks."""
        links = {}
        for name in _HOST_SYSTEM_DIRS:
            path = self.host_root / name
            if path.is_symlink():
                links[name] = os.readlink(path)
        key = hashlib.sha256(json.dumps([sorted(_SKELETON_DIRS.items()), sorted(links.items())]).encode()).hexdigest()
        target = base / f"skeleton-{key[:16]}"
        if target.exists():
            return target
        tmp = base / f".skeleton-{uuid.uuid4().hex}"
        tmp.mkdir(mode=0o755)
        for rel, mode in _SKELETON_DIRS.items():
            d = tmp / rel
            d.mkdir(parents=True, exist_ok=True)
            os.chmod(d, mode)
        for name, dest in links.items():
            os.symlink(dest, tmp / name)
        for name in _HOST_SYSTEM_DIRS:
            if (self.host_root / name).is_dir() and not (self.host_root / name).is_symlink():
                (tmp / name).mkdir(exist_ok=True)
        os.chmod(tmp, 0o755)
        try:
            os.rename(tmp, target)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)  # another provider made it first
        return target

    def _etc_mask(self, base: Path) -> Path:
        """A layer of whiteouts over every entry of /etc that is not world-readable.

        Keyed by content: a live sandbox keeps using the mask it started with even if
        /etc changes and a new provider makes a new one.
        """
        hidden: list[str] = []
        dirs: dict[str, os.stat_result] = {"": os.stat(self.host_etc)}
        for dirpath, dirnames, filenames in os.walk(self.host_etc):
            rel_dir = os.path.relpath(dirpath, self.host_etc)
            rel_dir = "" if rel_dir == "." else rel_dir
            keep = []
            for name in dirnames:
                rel = os.path.join(rel_dir, name)
                st = os.lstat(os.path.join(dirpath, name))
                if stat.S_ISLNK(st.st_mode):
                    continue
                if st.st_mode & 0o005 != 0o005:
                    hidden.append(rel)
                else:
                    dirs[rel] = st
                    keep.append(name)
            dirnames[:] = keep
            for name in filenames:
                st = os.lstat(os.path.join(dirpath, name))
                if not stat.S_ISLNK(st.st_mode) and not st.st_mode & 0o004:
                    hidden.append(os.path.join(rel_dir, name))
        hidden.sort()
        needed_dirs = sorted({os.path.dirname(h) for h in hidden} - {""})
        spec = json.dumps(
            [hidden, [(d, dirs[d].st_mode, dirs[d].st_uid, dirs[d].st_gid) for d in needed_dirs if d in dirs]]
        )
        target = base / f"etc-mask-{hashlib.sha256(spec.encode()).hexdigest()[:16]}"
        if target.exists():
            return target
        tmp = base / f".etc-mask-{uuid.uuid4().hex}"
        tmp.mkdir()
        root_st = dirs[""]
        os.chmod(tmp, stat.S_IMODE(root_st.st_mode))
        os.chown(tmp, root_st.st_uid, root_st.st_gid)
        for d in needed_dirs:
            # Parents of a hidden entry must carry the host's own attributes: overlayfs takes a
            # directory's attributes from the topmost layer that has it.
            parts = Path(d).parts
            for i in range(1, len(parts) + 1):
                rel = os.path.join(*parts[:i])
                path = tmp / rel
                if not path.exists():
                    path.mkdir()
                    st = dirs.get(rel, root_st)
                    os.chmod(path, stat.S_IMODE(st.st_mode))
                    os.chown(path, st.st_uid, st.st_gid)
        for h in hidden:
            os.mknod(tmp / h, stat.S_IFCHR | 0o000, os.makedev(0, 0))  # an overlayfs whiteout
        try:
            os.rename(tmp, target)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
        return target
