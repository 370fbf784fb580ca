"""``[inference] colocate = true``: around every train step the engine hands its weights and KV cache to the
trainer and takes them back, and the run samples the pushed weights after it; the async driver refuses it."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandrl.errors import ConfigError
from sandrl.rollout.jsonl import read_jsonl
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.train.command import run_training

from .conftest import ParityAgent, run_config

pytestmark = pytest.mark.timeout(300)


async def test_a_colocated_run_releases_and_resumes_the_engine_around_each_step(
    tmp_path: Path, provider: BwrapProvider
) -> None:
    out = tmp_path / "run"
    config = run_config(
        out,
        run={"steps": 2, "groups_per_step": 1},
        tasks={"family": "echo", "count": 4},
        rollout={"group_size": 4, "concurrency": 4, "max_turns": 1, "max_new_tokens": 4},
        inference={"colocate": True},
    )
    await run_training(config, provider=provider, agent=ParityAgent())
    records = [r for r in read_jsonl_dicts(out / "metrics.jsonl") if "colocate/release_s" in r]
    assert len(records) == 2 and all(r["colocate/release_s"] > 0 for r in records)
    assert records[1]["colocate/resume_s"] > 0  # the first step's resume, measured after its push
    episodes = read_jsonl(out / "rollouts.jsonl")
    assert {t.weight_version for t in episodes} == {0, 1} and not [t for t in episodes if t.status == "error"]


async def test_the_async_driver_refuses_colocation(tmp_path: Path, provider: BwrapProvider) -> None:
    config = run_config(tmp_path / "run", run={"steps": 1, "groups_per_step": 1}, inference={"colocate": True})
    with pytest.raises(ConfigError, match="colocate"):
        await run_training(config, mode="async", provider=provider, agent=ParityAgent())


def read_jsonl_dicts(path: Path) -> list[dict[str, object]]:
    import json

    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
