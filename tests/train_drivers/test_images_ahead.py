"""``sandrl train`` fetches every task's image in the background when it starts, in the order of
the run's first pass over the tasks, and its episodes take their images from that same fetcher."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sandrl.rollout import prefetch
from sandrl.rollout.jsonl import read_jsonl
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.tasks.task import Task
from sandrl.train import session
from sandrl.train.command import run_training
from sandrl.train.group_sources import task_at
from sandrl.wiring import task_set

from .conftest import ParityAgent, run_config


async def test_a_run_fetches_every_tasks_image_ahead_and_its_episodes_use_that_fetcher(
    tmp_path: Path, provider: BwrapProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def spy(provider: Any, tasks: list[Task], **kwargs: Any) -> AsyncIterator[prefetch.Prefetch]:
        async with prefetch.images_ahead(provider, tasks, **kwargs) as ahead:
            seen["tasks"], seen["kwargs"] = list(tasks), kwargs
            yield ahead
            seen["report"] = await ahead.job  # the run is short: let the prefetch finish to read it

    monkeypatch.setattr(session, "images_ahead", spy)
    out = tmp_path / "run"
    config = run_config(out, run={"steps": 1, "groups_per_step": 1}, tasks={"family": "echo", "count": 4})
    await run_training(config, rollout_only=True, provider=provider, agent=ParityAgent())
    loaded = task_set(config.tasks, out / "tasks")
    assert [t.id for t in seen["tasks"]] == [task_at(loaded, 0, p).id for p in range(4)]
    assert seen["kwargs"] == {"episode_jobs": config.rollout.concurrency}
    report = seen["report"]
    assert len(report.rows) == 4 and not [r for r in report.rows if r.outcome == "failed"]
    # The episodes found their image already made: fetched once, by the prefetch.
    episodes = read_jsonl(out / "rollouts.jsonl")
    assert episodes and {t.image for t in episodes} <= {r.name for r in report.rows}
