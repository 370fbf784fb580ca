"""The built-in task suite: Harbor-format task directories shipped with sandrl.

Each subdirectory holding a ``task.toml`` is one task (``instruction.md``, ``environment/``,
``tests/``, ``solution/``); ``generated`` writes families of tiny parametrised tasks for demos.
"""

from __future__ import annotations

from pathlib import Path

SUITE_DIR = Path(__file__).resolve().parent


def task_dirs() -> list[Path]:
    """The directories of the built-in tasks, sorted by name."""
    return sorted(p.parent for p in SUITE_DIR.glob("*/task.toml"))
