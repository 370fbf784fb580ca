"""``sandrl bench density``'s small form: 500 idle sandboxes live at once, then nothing left (issue #45)."""

from __future__ import annotations

from rich.console import Console

from sandrl.bench.density import run
from sandrl.sandbox.bwrap import BwrapProvider


async def test_500_live_sandboxes_close_with_nothing_left(provider: BwrapProvider) -> None:
    result = await run(live=500, samples=5, console=Console(quiet=True), provider=provider)
    held = result["held"]
    assert result["create_errors"] == 0, result["first_errors"]
    assert held["live"] == 500 and held["live_with_network"] == 25
    assert held["sampled_execs_ok"] == 20
    assert result["leftovers_after_close"] == dict.fromkeys(result["leftovers_after_close"], 0)
    assert result["checks"]["closed_cleanly"]
    # What the provider holds per live sandbox: one socket (and a NAT's pipe), one task (its reader), no
    # thread; no mount.
    per = held["provider_per_sandbox"]
    assert per["fds"] <= 1.1 and per["tasks"] <= 1.01 and per["threads"] < 0.01 and per["mount_lines"] == 0
    assert held["host_links_added"] == 0
