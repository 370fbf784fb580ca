"""The image store: read-only root filesystems that sandboxes start from.

An *image* is a stack of read-only layer directories (topmost first). A sandbox mounts
them idmapped and read-only, with its own copy-on-write layer on top, so any number of
sandboxes share one image on disk and none can change it.

Layout under the store's root::

    images/<name>.json     name, layers (ids, topmost first), env, workdir, created; optionally
                           base (an image the layers are stacked on) and config (build metadata)
    layers/<id>/           one layer: a directory tree (for a full image, a whole rootfs)
    host/                  what the built-in ``host`` image needs (skeleton, masks)

New layers (snapshots, forks, build steps, imports) never take the store's filesystem below its
reserve (:class:`~.layer_budget.StoreReserve`: ``$SANDRL_STORE_MIN_FREE_MB``, else 5% of it, and
5% of its inodes), and keep holes as holes (:mod:`.layer_budget`).

Every file of a layer (``layers/`` and ``host/``) is owned in the store's own uid mapping,
never by host root, and no file has a setuid or setgid bit (:mod:`.layer_owners`); the store's
directories are 0700, so no host user reaches a layer at all. A store written by an older
sandrl (layers owned by host root) is shifted once, when a store is first opened on it as root.

The built-in image ``host`` is the host's own ``/usr`` (with ``/bin``, ``/sbin``, ``/lib*``
as on the host) and ``/etc``, live, minus every entry the host's unprivileged users could not read
(``/etc/shadow``, ssh host keys, a 0600 file under ``/usr/local``...): hidden by overlayfs
whiteouts kept current with the host when a sandbox is made, and unreadable through an
unprivileged view of each directory whenever the host makes them so later (:mod:`.host_views`).
Nothing else of the host appears: ``/root``, ``/home``, ``/var``, ``/opt``, ``/tmp`` and ``/run``
start empty.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from sandrl.errors import ConfigError, ImageNotFoundError, SandboxError, SandboxUnavailableError
from sandrl.images.manifest import DEFAULT_PATH
from sandrl.sandbox.bwrap.host_views import host_views, mask_layer, viewable
from sandrl.sandbox.bwrap.layer_budget import LayerBudget, StoreReserve
from sandrl.sandbox.bwrap.layer_owners import STORE_UID_BASE, copy_shifted, shift_in_place, store_id

__all__ = ["HOST_IMAGE", "STORE_UID_BASE", "Image", "ImageStore", "MountPlan", "stack_layers"]

HOST_IMAGE = "host"
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")
_LAYER_ID = re.compile(r"^[0-9a-f]{32}$")
_HOST_SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
_MIGRATED = ".owners-shifted"
"""Marker in the store's root: its layers are in the store's uid mapping (see :meth:`ImageStore._open`)."""
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
    store_layers: frozenset[int] = frozenset()
    """Indices into ``layers`` whose files are in the store's uid mapping (on-disk owner
    ``STORE_UID_BASE + n`` is sandbox uid ``n``); the others are host directories (host root is
    sandbox root)."""
    host_views: frozenset[int] = frozenset()
    """Indices into ``layers`` of host directories seen through the unprivileged view, which reads
    only what the host's users may read as the host is at each moment (:mod:`.host_views`); a host
    directory not in it (on a stacking filesystem: :func:`~.host_views.viewable`) is shown as it is."""


def stack_layers(plan: MountPlan, layers: tuple[Path, ...]) -> MountPlan:
    """``plan`` with layer trees (topmost first) stacked on each of its overlays.

    A layer tree holds the changes under every mount point at its own path (``<layer>/usr``
    for the overlay on ``/usr``, as :func:`sandrl.sandbox.bwrap.export.export_changes` writes it); a
    layer that has nothing under a mount point is left out of that overlay.
    """
    all_layers = list(plan.layers)
    store_layers = set(plan.store_layers)
    overlays: list[tuple[str, tuple[int, ...]]] = []
    for target, indices in plan.overlays:
        rel = target.strip("/")
        added: list[int] = []
        for layer in layers:
            path = layer / rel if rel else layer
            if path.is_dir() and not path.is_symlink():
                all_layers.append(path)
                added.append(len(all_layers) - 1)
        store_layers.update(added)
        overlays.append((target, (*added, *indices)))
    return MountPlan(
        layers=tuple(all_layers),
        overlays=tuple(overlays),
        store_layers=frozenset(store_layers),
        host_views=plan.host_views,
    )


@dataclass(frozen=True)
class Image:
    name: str
    plan: MountPlan
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    created: float = 0.0
    entrypoint: tuple[str, ...] | None = None
    """The image's ``ENTRYPOINT`` (a pulled image's config, or a Dockerfile's), started after create."""


class ImageStore:
    """Images on disk under ``root`` (default ``<state dir>/images``); ``reserve``: what new layers
    leave free on its filesystem (default :meth:`StoreReserve.from_env`)."""

    def __init__(
        self,
        root: Path,
        *,
        host_etc: Path = Path("/etc"),
        host_root: Path = Path("/"),
        reserve: StoreReserve | None = None,
    ) -> None:
        self.root = root
        self.reserve = reserve or StoreReserve.from_env()
        self.host_etc = host_etc
        self.host_root = host_root
        self._host: tuple[object, Image] | None = None
        self._host_layout: tuple[tuple[int, int], list[str], dict[str, str]] | None = None
        if os.geteuid() == 0:  # only root writes a store; anyone else just reads what root allows
            self._open()

    def _open(self) -> None:
        """Close the store's directories to host users, and shift a store of an older sandrl once."""
        for d in (self.root, self.root / "images", self.root / "layers", self.root / "host"):
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chown(d, 0, 0)
            os.chmod(d, 0o700)
        if (self.root / _MIGRATED).exists():
            return
        with open(self.root / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # two providers opening one old store: one shifts it
            if (self.root / _MIGRATED).exists():
                return
            # Layers written before were owned as the sandbox saw them (host root = sandbox root).
            try:
                for top in (self.root / "layers", self.root / "host"):
                    for layer in top.iterdir():
                        if layer.is_dir() and not layer.is_symlink():
                            shift_in_place(layer)
            except OSError as exc:
                raise SandboxUnavailableError(
                    f"the image store {self.root} holds layers of an older sandrl, owned by host root, and "
                    f"shifting them into the store's own uids failed ({exc}); fix that and open it again, or "
                    f"remove {self.root / 'layers'} and {self.root / 'host'} and rebuild the images"
                ) from exc
            (self.root / _MIGRATED).write_text(f"store uid base {STORE_UID_BASE:#x}\n")

    # -- reading

    def get(self, name: str, *, _depth: int = 0) -> Image:
        if name == HOST_IMAGE:
            return self.host_image()
        meta = self._meta_path(name)
        if not meta.exists():
            raise ImageNotFoundError(
                f"no image named {name!r} in {self.root}: `sandrl images ls` lists them; pull one (sandrl images "
                "pull REF), build one (sandrl images build) or import a rootfs (sandrl images import)"
            )
        data = json.loads(meta.read_text())
        layers = tuple(self.root / "layers" / lid for lid in data["layers"])
        for layer in layers:
            if not layer.is_dir():
                raise ImageNotFoundError(f"image {name!r} is damaged: its layer {layer} is missing; rebuild it")
        base_name = data.get("base")
        if base_name is None:
            indices = tuple(range(len(layers)))
            plan = MountPlan(layers=layers, overlays=(("/", indices),), store_layers=frozenset(indices))
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
        config = data.get("config") or {}
        entrypoint = config.get("entrypoint") if isinstance(config, dict) else None
        return Image(
            name=name,
            plan=plan,
            env=env,
            workdir=workdir,
            created=float(data.get("created", 0.0)),
            entrypoint=tuple(str(a) for a in entrypoint) if isinstance(entrypoint, list) and entrypoint else None,
        )

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

    def add_layer(self, source: Path, *, move: bool = False, layer_id: str | None = None) -> str:
        """Copy (or move) a directory tree into the store as a new read-only layer; return its id.

        The tree's owners are the sandbox's (host root = sandbox root, as a debootstrap rootfs or
        an exported layer has them); in the store they are shifted into the store's mapping and
        setuid/setgid bits are dropped (:mod:`.layer_owners`). A moved tree is fixed inside the
        store's private directory before it becomes a layer; a copied one keeps its holes and never
        takes the store below its reserve (:class:`~sandrl.errors.LayerTooLargeError`).

        ``layer_id`` (32 hex digits) names the layer after its content: when the store has that layer
        already, nothing is copied (nor when another process made it meanwhile).
        """
        if not source.is_dir() or source.is_symlink():
            raise ConfigError(f"{source} is not a directory; a layer is a directory tree")
        layers = self.root / "layers"
        if layer_id is not None and not _LAYER_ID.match(layer_id):
            raise ConfigError(f"a layer id is 32 hex digits, got {layer_id!r}")
        if layer_id is not None and (layers / layer_id).is_dir():
            return layer_id
        layer_id = layer_id or uuid.uuid4().hex
        target = layers / layer_id
        tmp = layers / f".{layer_id}.tmp"
        try:
            if move:
                os.rename(source, tmp)
                shift_in_place(tmp)
            else:
                owner = f"the tree {source}"
                copy_shifted(source, tmp, LayerBudget(layers, self.reserve, disk_mb=None, owner=owner, hint=""))
            os.rename(tmp, target)
        except BaseException as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if not isinstance(exc, OSError):
                raise
            if target.is_dir():
                return layer_id  # a named layer another process made first
            raise SandboxError(
                f"cannot bring {source} into the image store at {layers} ({exc}); the store must be written "
                "as root, and a tree moved in must be on the store's filesystem (or add it with move=False)"
            ) from exc
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
        self.check_name(name)
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
        self.check_name(name)
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

    def check_name(self, name: str) -> None:
        if not _NAME.match(name) or name == HOST_IMAGE:
            raise ConfigError(
                f"{name!r} is not a usable image name: lower-case letters, digits, '.', '_', '-'; 'host' is built in"
            )

    # -- the built-in host image

    def host_image(self) -> Image:
        """The host image as the host is now: a new mask layer whenever a root-only entry came or went."""
        views = host_views()
        names, links = self._host_top_level()
        shown = [(name, self.host_root / name) for name in names]
        shown.append(("etc", self.host_etc))
        states = [(name, path, *views.hidden(path), viewable(path)) for name, path in shown]
        key = (links, [(str(path), generation, view) for _, path, generation, _, view in states])
        if self._host is not None and self._host[0] == key:
            return self._host[1]
        base = self.root / "host"
        layers: list[Path] = [self._skeleton(base, links, [name for name, _ in shown if name != "etc"])]
        store_layers = {0}
        viewed: set[int] = set()
        overlays: list[tuple[str, tuple[int, ...]]] = [("/", (0,))]
        for name, path, _, hidden, view in states:
            indices: list[int] = []
            mask = mask_layer(base, name, path, hidden)
            if mask is not None:
                layers.append(mask)
                store_layers.add(len(layers) - 1)
                indices.append(len(layers) - 1)
            layers.append(path)
            indices.append(len(layers) - 1)
            if view:
                viewed.add(len(layers) - 1)
            overlays.append((f"/{name}", tuple(indices)))
        plan = MountPlan(
            layers=tuple(layers),
            overlays=tuple(overlays),
            store_layers=frozenset(store_layers),
            host_views=frozenset(viewed),
        )
        image = Image(
            name=HOST_IMAGE,
            plan=plan,
            env={"PATH": DEFAULT_PATH},
            workdir="/workspace",
        )
        self._host = (key, image)
        return image

    def _host_top_level(self) -> tuple[list[str], dict[str, str]]:
        """Which of the host's system directories are real directories, and which are symlinks (to
        where): looked at again only when the host's ``/`` changed (an entry made, removed or
        replaced changes its mtime), not on every create."""
        top = os.stat(self.host_root)
        stamp = (top.st_ino, top.st_mtime_ns)
        if self._host_layout is None or self._host_layout[0] != stamp:
            names, links = [], {}
            for name in _HOST_SYSTEM_DIRS:
                path = self.host_root / name
                if path.is_symlink():
                    links[name] = os.readlink(path)
                elif path.is_dir():
                    names.append(name)
            self._host_layout = (stamp, names, links)
        return self._host_layout[1], self._host_layout[2]

    def _skeleton(self, base: Path, links: dict[str, str], mount_points: list[str]) -> Path:
        """The top level of the host image: empty directories, and the host's /bin-style symlinks.

        A store layer like any other (owned in the store's mapping), so its ``tmp`` and ``var/tmp``,
        1777 inside, are nobody's on the host, under the store's 0700 directories.
        """
        spec = ["skeleton-2", sorted(_SKELETON_DIRS.items()), sorted(links.items()), sorted(mount_points)]
        key = hashlib.sha256(json.dumps(spec).encode()).hexdigest()
        target = base / f"skeleton-{key[:16]}"
        if target.exists():
            return target
        tmp = base / f".skeleton-{uuid.uuid4().hex}"
        tmp.mkdir(mode=0o700)
        root = store_id(0)
        dirs = [*_SKELETON_DIRS.items(), *((name, 0o755) for name in mount_points)]
        for rel, mode in dirs:
            d = tmp / rel
            d.mkdir(mode=0o700, exist_ok=True)
            os.chown(d, root, root)
            os.chmod(d, mode)
        for name, dest in links.items():
            os.symlink(dest, tmp / name)
            os.chown(tmp / name, root, root, follow_symlinks=False)
        os.chown(tmp, root, root)
        os.chmod(tmp, 0o755)
        try:
            os.rename(tmp, target)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)  # another provider made it first
        return target
