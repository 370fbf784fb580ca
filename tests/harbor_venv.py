"""Harbor's own virtualenv (Python >= 3.12, with sandrl-harbor), for the tests that run Harbor.

``scripts/harbor-env.sh`` makes it once (``make test`` runs it before pytest); asking again costs
a fraction of a second. Where no Python >= 3.12 exists, the tests that need it skip, saying so.
"""

from __future__ import annotations

import subprocess
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NO_PYTHON = 3
"""scripts/harbor-env.sh's exit status when no Python >= 3.12 exists."""


@cache
def _made() -> tuple[int, str, str]:
    r = subprocess.run(["bash", str(ROOT / "scripts" / "harbor-env.sh")], capture_output=True, text=True, timeout=900)
    return r.returncode, r.stdout, r.stderr


def harbor_venv() -> Path:
    """The virtualenv's directory; skips the test where no Python >= 3.12 exists."""
    code, out, err = _made()
    if code == NO_PYTHON:
        pytest.skip(f"Harbor needs Python >= 3.12 and this machine has none: {err.strip()}")
    assert code == 0, err
    return Path(out.strip().splitlines()[-1])
