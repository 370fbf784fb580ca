"""What ``sandrl images prune`` removes: tasks' images, the builder's cache, forks' images, and
layers no image uses.

Images and layers that a live sandbox of this host uses are kept (a sandbox's record names its
image; its layers are that image's and its bases'), and so are the layers of every image that
stays. Partial downloads and unpack leftovers of pulls that no longer run go too. The plan says
how much each kind frees (:class:`PruneKind`): a layer counts for the first kind, in
:data:`KINDS`' order, whose images use it; layers no image used before are ``unused layers``.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from sandrl.errors import ImageNotFoundError
from sandrl.sandbox.bwrap.dockerfile.names import BUILD_PREFIX, TASK_PREFIX
from sandrl.sandbox.bwrap.images import HOST_IMAGE, ImageStore
from sandrl.sandbox.bwrap.pulled import WORK_DIR
from sandrl.sandbox.bwrap.snapshot import FORK_PREFIX
from sandrl.sandbox.bwrap.state import StateDir
from sandrl.sandbox.bwrap.store_usage import tree_bytes

__all__ = ["KINDS", "PruneKind", "PrunePlan", "apply_prune", "plan_prune"]

KINDS = (("task images", TASK_PREFIX), ("build cache images", BUILD_PREFIX), ("fork images", FORK_PREFIX))
"""The images prune removes, by what their names start with."""


@dataclass(frozen=True)
class PruneKind:
    """One kind of what a prune removes: how many, and the bytes their removal frees."""

    name: str
    names: tuple[str, ...]
    bytes: int


@dataclass(frozen=True)
class PrunePlan:
    images: tuple[str, ...]
    """Tasks' images (``task-*``), cache images (``build-*``) and the images of forks (``fork-*``) to forget."""
    layers: tuple[str, ...]
    """Layer directories no remaining image uses."""
    leftovers: tuple[str, ...]
    """Files of pulls that are not running any more (partial downloads, unpack trees)."""
    bytes: int
    """What removing all of it frees on disk."""
    kinds: tuple[PruneKind, ...] = ()
    """The same by kind: :data:`KINDS`, then ``unused layers`` and ``pull leftovers``."""

    def __bool__(self) -> bool:
        return bool(self.images or self.layers or self.leftovers)


def _live_images(state: StateDir) -> set[str]:
    dead = set(state.dead_records())
    live: set[str] = set()
    for sid in state.records():
        if sid in dead:
            continue
        meta = state.read_record(sid)
        spec = meta.get("spec") if meta else None
        image = spec.get("image") if isinstance(spec, dict) else None
        if isinstance(image, str):
            live.add(image)
    return live


def _layers_of(store: ImageStore, name: str) -> set[str]:
    """Layer ids of ``name`` and of the images it is stacked on."""
    found: set[str] = set()
    for _ in range(16):
        if name == HOST_IMAGE:
            break
        try:
            meta = store.meta(name)
        except ImageNotFoundError:
            break
        layers = meta.get("layers")
        if isinstance(layers, list):
            found.update(str(x) for x in layers)
        base = meta.get("base")
        if not isinstance(base, str):
            break
        name = base
    return found


def plan_prune(store: ImageStore, state: StateDir, *, build_cache: bool = True, tasks: bool = True) -> PrunePlan:
    """``build_cache``: the cache and fork images go; ``tasks``: tasks' images go (each only
    when no live sandbox uses it); and with them every layer no image that stays uses."""
    live = _live_images(state)
    names = [n for n in store.names() if n != HOST_IMAGE]
    prefixes = (TASK_PREFIX,) * tasks + (BUILD_PREFIX, FORK_PREFIX) * build_cache
    doomed = [n for n in names if n.startswith(prefixes) and n not in live]
    kept_layers: set[str] = set()
    for name in names:
        if name not in doomed:
            kept_layers |= _layers_of(store, name)
    layers_dir = store.root / "layers"
    layers = sorted(
        d.name
        for d in (layers_dir.iterdir() if layers_dir.is_dir() else [])
        if d.is_dir() and not d.name.startswith(".") and d.name not in kept_layers
    )
    sizes = {lid: tree_bytes(layers_dir / lid) for lid in layers}
    unclaimed = set(layers)
    kinds = []
    for kind, prefix in KINDS:
        of_kind = tuple(n for n in doomed if n.startswith(prefix))
        claimed: set[str] = set()
        for name in of_kind:
            claimed |= _layers_of(store, name) & unclaimed
        unclaimed -= claimed
        kinds.append(PruneKind(kind, of_kind, sum(sizes[lid] for lid in claimed)))
    kinds.append(PruneKind("unused layers", tuple(sorted(unclaimed)), sum(sizes[lid] for lid in unclaimed)))
    leftovers = sorted(p.name for p in _idle_pull_files(layers_dir / WORK_DIR))
    leftover_bytes = 0
    for name in leftovers:
        path = layers_dir / WORK_DIR / name
        leftover_bytes += tree_bytes(path) if path.is_dir() else path.stat().st_size
    kinds.append(PruneKind("pull leftovers", tuple(leftovers), leftover_bytes))
    return PrunePlan(
        images=tuple(doomed),
        layers=tuple(layers),
        leftovers=tuple(leftovers),
        bytes=sum(sizes.values()) + leftover_bytes,
        kinds=tuple(kinds),
    )


def _idle_pull_files(work: Path) -> list[Path]:
    """Blobs and trees of ``work`` whose layer lock nobody holds (no pull is working on them)."""
    if not work.is_dir():
        return []
    idle: list[Path] = []
    for entry in work.iterdir():
        if entry.suffix == ".lock":
            continue
        stem = entry.name.split(".", 1)[0]
        lock = work / f"{stem}.lock"
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            idle.append(entry)
        except BlockingIOError:
            pass
        finally:
            os.close(fd)
    return idle


def apply_prune(store: ImageStore, plan: PrunePlan) -> None:
    for name in plan.images:
        if store.exists(name):
            store.remove(name)
    layers_dir = store.root / "layers"
    for lid in plan.layers:
        shutil.rmtree(layers_dir / lid, ignore_errors=True)
    for name in plan.leftovers:
        path = layers_dir / WORK_DIR / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
