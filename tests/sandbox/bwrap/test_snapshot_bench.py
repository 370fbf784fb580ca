"""The snapshot, fork and pause rows of `sandrl bench sandbox`, at a small size."""

from __future__ import annotations

from sandrl.bench import snapshots
from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider

from ...support import needs_sandbox

pytestmark = needs_sandbox


async def test_the_rows_measure_and_leave_no_image_behind(provider: BwrapProvider) -> None:
    before = set(provider.images.names())
    ticks: list[int] = []
    taken = provider.premade.taken
    rows = await snapshots.run(provider, SandboxSpec(ttl_s=120), 2, lambda: ticks.append(1))
    assert set(rows) == {
        "snapshot_10mib",
        "fork_1_until_exec",
        "fork_16_until_exec",
        "fork_16_first_until_exec",
        "pause_resume",
    }
    # The steady-state forks took their children's launches made ahead, and none is left after.
    assert provider.premade.taken - taken >= 2 * 16 and not any(provider.premade.idle.values())
    assert rows["snapshot_10mib"]["n"] == 2 and rows["fork_16_until_exec"]["n"] == 2 and len(ticks) == 2
    assert all(row["p50_ms"] > 0 for row in rows.values())
    assert set(provider.images.names()) == before
