"""The split of a cold create in `sandrl bench sandbox` (sandrl.bench.cold_split), with real sandboxes."""

from __future__ import annotations

from sandrl.bench.cold_split import STEPS, cold_split, helper_times
from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider

from ...support import needs_sandbox

pytestmark = needs_sandbox

SPEC = SandboxSpec(ttl_s=60, memory_mb=321)
"""Limits no fork of the shared provider asked launches made ahead for: every create here is cold."""


def test_only_the_helpers_own_lines_are_read() -> None:
    log = "sandrl-times started 1000000\nsandrl-times joined 1000250\nsandrl-times nope 5\nsandrl-times root x\n"
    assert helper_times(log + "sandrl-helper: something went wrong\n") == {"started": 1.0, "joined": 1.00025}


async def test_each_part_is_timed_and_they_add_up(provider: BwrapProvider) -> None:
    ticks: list[int] = []
    split = await cold_split(provider, SPEC, 3, lambda: ticks.append(1))
    assert split["n"] == 3 and len(ticks) == 3
    parts = ("provider", "helper", "agent_hello", "first_exec")
    steps = ("cgroup_joins", "namespaces_and_pid1", "root_and_dev", "handover")
    values = {k: split[f"{k}_ms"] for k in (*parts, *steps, "total")}
    assert all(isinstance(v, float) and v > 0 for v in values.values()), values
    # Medians of parts need not add up exactly to the median of the sums: within a quarter.
    assert abs(sum(values[k] for k in parts) - values["total"]) < 0.25 * values["total"]
    assert abs(sum(values[k] for k in steps) - values["helper"]) < 0.25 * values["helper"]
    assert provider.launcher.times is False  # the launches after the row are as before


async def test_a_launch_writes_its_times_only_when_asked(provider: BwrapProvider) -> None:
    async with await provider.create(SPEC) as sandbox:
        assert helper_times((provider.state.record_dir(sandbox.id) / "log").read_text()) == {}
    provider.launcher.times = True
    try:
        async with await provider.create(SPEC) as sandbox:
            times = helper_times((provider.state.record_dir(sandbox.id) / "log").read_text())
    finally:
        provider.launcher.times = False
    assert set(times) == set(STEPS)
    assert [times[s] for s in STEPS] == sorted(times[s] for s in STEPS)  # the launch's order
