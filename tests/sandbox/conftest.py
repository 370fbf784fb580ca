"""Fixtures for the sandbox tests: real sandboxes from a real BwrapProvider."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider, BwrapSandbox
from sandrl.sandbox.bwrap.images import MountPlan
from sandrl.sandbox.bwrap.launch import PremadeKind

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


class AlwaysPremade(BwrapProvider):
    """A provider whose every create takes a launch made ahead (:mod:`sandrl.sandbox.bwrap.premade`),
    whose pid 1 waits for its root: the tests that hold a sandbox's surface run on both launches."""

    async def _create(self, spec: SandboxSpec, image_env: dict[str, str], plan: MountPlan) -> BwrapSandbox:
        self.premade.want(PremadeKind.of(spec), 1)
        await self.premade.wait_full()
        taken = self.premade.taken
        sandbox = await super()._create(spec, image_env, plan)
        assert self.premade.taken == taken + 1, f"not made ahead: {self.premade.last_error}"
        return sandbox


@pytest.fixture(scope="module", params=["full", "premade"])
def either_launch(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BwrapProvider]:
    """A provider of each launch the helper makes: in full (a create's) and made ahead (a fork's
    children's). A module overrides ``provider`` with it to run its tests on both (bubblewrap's
    launch, ``launcher="bubblewrap"``, is held to the same surface in ``bwrap/test_launchers.py``)."""
    if REASON is not None:
        pytest.skip(REASON)
    kind = BwrapProvider if request.param == "full" else AlwaysPremade
    p = kind(tmp_path_factory.mktemp(f"sandrl-{request.param}"))
    yield p
    p._close_all_sync()


@pytest.fixture
async def sandbox(provider: BwrapProvider) -> AsyncIterator[BwrapSandbox]:
    sb = await provider.create(SandboxSpec(ttl_s=300))
    try:
        yield sb
    finally:
        await sb.close()
