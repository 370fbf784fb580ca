"""Where sandrl keeps what it fetched and may fetch again: ``$SANDRL_CACHE_DIR/<name>``, else the
user's cache directory (``$XDG_CACHE_HOME/sandrl/<name>`` or ``~/.cache/sandrl/<name>``)."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "SANDRL_CACHE_DIR"


def cache_dir(name: str) -> Path:
    """The cache directory of ``name`` (``swebench``, ``datasets``...); not created here."""
    root = os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "sandrl"
    )
    return Path(root) / name
