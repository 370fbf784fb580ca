"""Staleness judged per token: a trajectory that a weight update split carries two versions, and the
bound, the samples' version and the metrics follow its tokens (:mod:`sandrl.train.staleness`)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from rich.console import Console

from sandrl.rollout.runner import Group
from sandrl.rollout.trajectory import Trajectory, Turn
from sandrl.train.adapter import to_sample
from sandrl.train.buffer import GroupBuffer
from sandrl.train.group_sources import FileSource
from sandrl.train.session import Session
from sandrl.train.staleness import (
    group_version,
    mixed_version,
    model_token_versions,
    oldest_version,
    staleness,
    token_staleness_hist,
)

from .conftest import run_config


def _split(gid: str, index: int, *turns: list[int] | None, final: int = 0, reward: float = 1.0) -> Trajectory:
    """A trajectory of 2-token prompt + per turn: 3 output tokens (versions given, or None: not recorded,
    the turn only says ``final``) and 1 observation token."""
    ids, mask, recorded = [1, 2], [0, 0], []
    for i, versions in enumerate(turns):
        start = len(ids)
        ids += [5, 6, 7, 9]
        mask += [1, 1, 1, 0]
        recorded.append(
            Turn(
                i,
                "ls",
                output_start=start,
                output_end=start + 3,
                weight_version=versions[-1] if versions else final,
                start_weight_version=versions[0] if versions else None,
                output_weight_versions=versions,
            )
        )
    versions_seen = [v for t in recorded for v in (t.start_weight_version, t.weight_version) if v is not None]
    return Trajectory(
        f"{gid}/{index}",
        gid,
        "t",
        index,
        "llm",
        "completed",
        reward=reward,
        ids=ids,
        loss_mask=mask,
        logprobs=[0.0] * len(ids),
        turns=recorded,
        weight_version=min(versions_seen),  # what run_episode records: the oldest any turn started on
    )


def test_a_trajectory_split_by_an_update_is_judged_by_its_tokens() -> None:
    split = _split("g", 0, [3, 3, 4], [4, 4, 4])
    assert model_token_versions(split) == [3, 3, 4, 4, 4, 4]
    assert oldest_version(split) == 3 and mixed_version(split)
    assert token_staleness_hist([split], 5) == {"1": 4, "2": 2}
    # The bound is the oldest token's: the group is 2 versions behind version 5, not 1.
    group = Group("g", "t", [split, _split("g", 1, [4, 4, 4], reward=0.0)])
    assert group_version(group) == 3 and staleness(group, 5) == 2
    # The trained sample names its oldest weights, so the trainer's staleness metric agrees.
    assert to_sample(split).weight_version == 3


def test_a_turn_without_per_token_record_is_judged_conservatively() -> None:
    # The server said only "final version 4"; the trajectory says a turn started on 2.
    unknown = _split("g", 0, None, final=4)
    unknown = Trajectory(**{**unknown.__dict__, "weight_version": 2})
    assert model_token_versions(unknown) == [4, 4, 4]
    assert oldest_version(unknown) == 2 and not mixed_version(unknown)


async def test_the_buffer_drops_by_the_oldest_token_and_the_metrics_count_tokens(tmp_path: Path) -> None:
    """Version 5, bound 1: a group whose first tokens came from 3 is dropped though most came from 5."""
    old_head = Group("run/t#0", "t", [_split("run/t#0", 0, [3, 5, 5], [5, 5, 5]), _split("run/t#0", 1, [5, 5, 5])])
    fresh_samples = [_split("run/t#1", 0, [4, 4, 5], [5, 5, 5]), _split("run/t#1", 1, [5, 5, 5], reward=0)]
    fresh = Group("run/t#1", "t", fresh_samples)
    config = run_config(tmp_path, **{"async": {"max_staleness": 1, "on_stale": "drop"}})
    session = Session(config, FileSource([old_head, fresh], limit=2), None, mode="async", console=Console(quiet=True))
    session.pushed_version = 5
    buffer = GroupBuffer(capacity=2, max_staleness=1)
    producer = asyncio.create_task(buffer.fill(session))
    try:
        items, stats = await asyncio.wait_for(buffer.take(1, session), timeout=10)
        assert [g.group_id for _, g in items] == ["run/t#1"] and session.counters.stale_dropped == 1
        record = await session.train(items, **stats)
    finally:
        producer.cancel()
        await asyncio.gather(producer, return_exceptions=True)
        session.close()
    assert record["staleness_hist"] == {"0": 1, "1": 1}  # per trajectory: its oldest token
    assert record["token_staleness_hist"] == {"0": 7, "1": 2}  # per model token
    assert record["mixed_version_samples"] == 1
    line = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert line["token_staleness_hist"] == {"0": 7, "1": 2}
