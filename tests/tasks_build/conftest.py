"""Fixtures for the builder tests: a real BwrapProvider on a state directory of the session's own."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandrl.sandbox.bwrap import BwrapProvider

from ..support import REASON as SANDBOX_REASON

# Exporting a build step's layer also needs nsenter.
REASON = SANDBOX_REASON or (None if shutil.which("nsenter") else "nsenter (util-linux) is not installed")


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
