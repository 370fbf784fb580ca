"""How much disk an image store takes: what ``sandrl images prefetch`` reports and bounds.

A store's layers never change once made (a layer directory is renamed into ``layers/`` whole and
only ever removed), so each is measured once, by id, and a store shared by many images counts
every layer once. What a pull has in flight (``layers/.pull``) is measured afresh each time.
Sizes are the blocks files take (holes cost nothing), as ``du`` counts them.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

from sandrl.sandbox.bwrap.images import ImageStore
from sandrl.sandbox.bwrap.pulled import WORK_DIR

__all__ = ["StoreUsage", "tree_bytes"]


def tree_bytes(path: Path) -> int:
    """The disk the files under ``path`` take; entries that vanish meanwhile count nothing."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


class StoreUsage:
    """The disk use of one store, with each layer measured once (see the module)."""

    def __init__(self, store: ImageStore) -> None:
        self.store = store
        self._layers: dict[str, int] = {}
        self._lock = threading.Lock()

    def bytes(self) -> int:
        """The store's layers and the pulls in flight, now. Blocking (a walk of new layers)."""
        layers_dir = self.store.root / "layers"
        present = {d.name for d in layers_dir.iterdir() if not d.name.startswith(".")} if layers_dir.is_dir() else set()
        with self._lock:  # two callers (threads) measure a new layer once
            for gone in set(self._layers) - present:
                del self._layers[gone]
            for new in present - set(self._layers):
                self._layers[new] = tree_bytes(layers_dir / new)
            total = sum(self._layers.values())
        return total + tree_bytes(layers_dir / WORK_DIR)
