"""Fixtures for the builder tests: a real BwrapProvider on a state directory of the session's own."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandrl.sandbox.bwrap import BwrapProvider


def _why_not_runnable() -> str | None:
    if os.geteuid() != 0:
        return "the bwrap backend needs root"
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (apt-get install bubblewrap)"
    if shutil.which("nsenter") is None:
        return "nsenter (util-linux) is not installed"
    return None


REASON = _why_not_runnable()


@pytest.fixture(scope="session")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sandrl-build-state")


@pytest.fixture(scope="session")
def provider(state_dir: Path) -> Iterator[BwrapProvider]:
    if REASON is not None:
        pytest.skip(REASON)
    p = BwrapProvider(state_dir)
    yield p
    p._close_all_sync()
