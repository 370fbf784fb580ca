"""Who makes a full launch's pid 1: the helper by default, bubblewrap behind ``launcher="bubblewrap"``
(``$SANDRL_LAUNCHER``); both give the surface bubblewrap gives, as recorded (``surface.py``)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandrl.errors import ConfigError
from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider, BwrapSandbox

from ...support import needs_sandbox
from .surface import facets, recorded

pytestmark = needs_sandbox

SPEC = SandboxSpec(ttl_s=60, memory_mb=300, pids=200)


def _monitor_program(sandbox: BwrapSandbox) -> str:
    """The program of the host-side process that holds pid 1 (the helper's launcher, or bubblewrap)."""
    return os.path.basename(os.readlink(f"/proc/{sandbox._proc.pid}/exe"))


@pytest.fixture
async def by_bwrap(tmp_path: Path) -> AsyncIterator[BwrapProvider]:
    provider = BwrapProvider(tmp_path / "state", launcher="bubblewrap")
    try:
        yield provider
    finally:
        await provider.close_all()


async def test_a_create_runs_no_bubblewrap_and_has_bubblewraps_surface(provider: BwrapProvider) -> None:
    async with await provider.create(SPEC) as sandbox:
        assert _monitor_program(sandbox) == "sandrl-helper"
        assert await facets(sandbox) == recorded()


async def test_the_bubblewrap_launcher_gives_the_recorded_surface_and_leaves_nothing(by_bwrap: BwrapProvider) -> None:
    """The recorded surface is still bubblewrap's, and a host that needs bubblewrap gets a whole
    sandbox: limits, the network, a clean close."""
    async with await by_bwrap.create(SPEC) as sandbox:
        assert _monitor_program(sandbox) == "bwrap"
        assert await facets(sandbox) == recorded()
        hog = await sandbox.exec("python3 -c 'b = bytearray(600 << 20); print(len(b))'", timeout_s=30)
        assert hog.exit_code != 0  # the memory limit holds
    async with await by_bwrap.create(SandboxSpec(ttl_s=60, network=True)) as networked:
        assert _monitor_program(networked) == "bwrap"
        devices = await networked.exec("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | sort")
        assert devices.stdout.split() == ["lo", "tap0"]
    await by_bwrap.close_all()
    assert by_bwrap.state.records() == [] and list(by_bwrap.cgroups.stale_groups()) == []


def test_the_launcher_is_named_in_code_or_by_the_environment(
    state_dir: Path, provider: BwrapProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert provider.launcher_name == "helper" and provider.launcher.bwrap is None
    monkeypatch.setenv("SANDRL_LAUNCHER", "bubblewrap")
    chosen = BwrapProvider(state_dir)
    assert chosen.launcher_name == "bubblewrap" and chosen.launcher.bwrap == chosen.bwrap is not None
    assert BwrapProvider(state_dir, launcher="helper").launcher.bwrap is None
    with pytest.raises(ConfigError, match=r"launcher: unknown launcher 'runc'; use one of helper, bubblewrap"):
        BwrapProvider(state_dir, launcher="runc")
    monkeypatch.setenv("SANDRL_LAUNCHER", "bwrap")
    with pytest.raises(ConfigError, match=r"\$SANDRL_LAUNCHER: unknown launcher 'bwrap'"):
        BwrapProvider(state_dir)
