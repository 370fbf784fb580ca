"""Emulating a smaller host: the plan, and that the limit is imposed and undone."""

from __future__ import annotations

import os

import pytest

from sandrl.bench import hostinfo, hostlimit
from sandrl.errors import ConfigError
from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider

from ..support import needs_sandbox

USABLE = sorted(os.sched_getaffinity(0))


def test_plan() -> None:
    assert hostlimit.plan(None).mode == "none"
    assert hostlimit.plan(None).cores == len(USABLE)
    assert hostlimit.plan(float(len(USABLE))).mode == "none"
    assert hostlimit.plan(0.5, sandbox_cpus=0.25).mode == "quota"
    assert hostlimit.plan(0.5, "quota", sandbox_cpus=0.5).cores == 0.5
    with pytest.raises(ConfigError, match="below each sandbox's own quota"):
        hostlimit.plan(0.5)
    with pytest.raises(ConfigError):
        hostlimit.plan(0.5, "affinity")
    with pytest.raises(ConfigError):
        hostlimit.plan(len(USABLE) + 1.0)
    if len(USABLE) > 1:
        one = hostlimit.plan(1)
        assert one.mode == "affinity" and one.cpus == (USABLE[-1],)


def test_cpu_model_parsing() -> None:
    assert hostinfo.cpu_model("processor\t: 0\nmodel name\t: AMD EPYC 9654\n") == "AMD EPYC 9654"
    info = hostinfo.describe(cores=1.0, limit={"mode": "affinity"})
    assert info["cores"] == 1.0 and info["sandbox_backend"] == "bwrap" and info["kernel"].startswith("Linux")


@needs_sandbox
@pytest.mark.skipif(len(USABLE) < 2, reason="needs two CPUs to pin to one")
async def test_affinity_reaches_the_sandbox_and_is_undone(provider: BwrapProvider) -> None:
    limit = hostlimit.plan(1)
    with hostlimit.applied(limit, provider):
        sandbox = await provider.create(SandboxSpec(ttl_s=60))
    try:
        assert sorted(os.sched_getaffinity(0)) == USABLE
        assert (await sandbox.exec("nproc")).stdout.strip() == "1"
    finally:
        await sandbox.close()


@needs_sandbox
@pytest.mark.skipif(len(USABLE) < 2, reason="needs two CPUs for a 1.5-core quota")
def test_quota_is_written_and_undone(provider: BwrapProvider) -> None:
    files = hostlimit._quota_files(provider)
    before = [p.read_text() for p, _, _ in files]
    with hostlimit.applied(hostlimit.plan(1.5, "quota"), provider):
        during = " ".join(p.read_text().strip() for p, _, _ in files)
        assert "150000" in during
    assert [p.read_text() for p, _, _ in files] == before
