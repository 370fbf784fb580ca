"""What the tests that run real sandboxes need from this host, said once."""

from __future__ import annotations

import os
import shutil

import pytest


def _why_not_runnable() -> str | None:
    if os.geteuid() != 0:
        return "the bwrap backend needs root"
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (apt-get install bubblewrap)"
    return None


REASON = _why_not_runnable()
"""Why real sandboxes cannot run here, or None when they can."""
needs_sandbox = pytest.mark.skipif(REASON is not None, reason=REASON or "")
