"""``sandrl bench density``'s small form: 500 idle sandboxes live at once, then nothing left (issue #45)."""

from __future__ import annotations

import asyncio

import pytest
from rich.console import Console

from sandrl.bench import density
from sandrl.bench.density import run
from sandrl.host_memory import meminfo_kb
from sandrl.sandbox.bwrap import BwrapProvider, BwrapSandbox


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


async def test_the_fill_stops_where_the_host_is_at_its_limit(
    provider: BwrapProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host with 5% of its memory available: the fill stops at its first check (20 creates), says why,
    and what it made is closed by the caller as run() does."""
    total = meminfo_kb("MemTotal") or 0
    monkeypatch.setattr(density, "meminfo_kb", lambda key: total // 20 if key == "MemAvailable" else meminfo_kb(key))
    live: list[BwrapSandbox] = []
    stopped: list[str] = []
    try:
        errors = await density._fill(provider, live, 100, 0, lambda: None, stopped)
    finally:
        await asyncio.gather(*(s.close() for s in live))
    assert not errors
    assert len(stopped) == 1 and "memory available" in stopped[0]
    assert 20 <= len(live) <= 20 + density.CREATE_CONCURRENCY
