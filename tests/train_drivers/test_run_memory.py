"""A run's memory is shown and stays flat: every step's record and line carry the driver's resident
memory, and 30 steps of a flat workload (real sandboxes, the real trainer) grow it by at most 10%
after step 10: what grows with the number of steps is a leak, and this test fails on it."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.train.command import run_training

from .conftest import ParityAgent, run_config

STEPS = 30
GROWTH = 1.10


async def test_thirty_steps_of_a_flat_workload_keep_the_drivers_memory_flat(
    tmp_path: Path, provider: BwrapProvider
) -> None:
    out = tmp_path / "run"
    config = run_config(
        out,
        run={"steps": STEPS, "groups_per_step": 1, "checkpoint_every": 0},
        rollout={"group_size": 2, "concurrency": 2},
    )
    console = Console(record=True, width=400)
    await run_training(config, mode="sync", provider=provider, agent=ParityAgent(), console=console)
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == STEPS
    rss = [s["rss_mb"] for s in steps]
    assert all(s["rss_peak_mb"] >= s["rss_mb"] > 0 for s in steps)
    assert max(rss[10:]) <= GROWTH * rss[9], f"the driver's memory grew step after step: {[round(r) for r in rss]} MiB"
    text = console.export_text()
    assert text.count(" rss ") == text.count(" (peak ") == STEPS  # each step's line says it, and the peak so far
    assert all("rss_ranks_mb" not in s for s in steps)  # the trainer runs in the driver: no rank processes
