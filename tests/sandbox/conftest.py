"""Fixtures for the sandbox tests: real sandboxes from a real BwrapProvider."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider, BwrapSandbox

from ..support import REASON


@pytest.fixture(scope="session")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sandrl-state")


@pytest.fixture(scope="session")
def provider(state_dir: Path) -> Iterator[BwrapProvider]:
    if REASON is not None:
        pytest.skip(REASON)
    p = BwrapProvider(state_dir)
    yield p
    p._close_all_sync()


@pytest.fixture
async def sandbox(provider: BwrapProvider) -> AsyncIterator[BwrapSandbox]:
    sb = await provider.create(SandboxSpec(ttl_s=300))
    try:
        yield sb
    finally:
        await sb.close()
