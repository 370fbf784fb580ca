"""The async driver's staleness bound: a group more than ``max_staleness`` versions old is dropped or regenerated.

Real drivers first, with ``max_staleness = 0`` and a trainer slower than the start of an episode,
as a real model's is (here each step first waits until one of the groups the driver started
meanwhile has sampled): those groups are sampled by weights one version behind the ones they
would be trained from, so staleness really occurs. Then the buffer alone, on hand-made groups,
for the exact boundary.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from sandrl.inference.base import Generation, InferenceClient, SamplingParams
from sandrl.rollout.agent import AgentResult, Budget
from sandrl.rollout.agents.scripted import CommandTimes, LongTailAgent
from sandrl.rollout.jsonl import read_jsonl
from sandrl.rollout.runner import Group
from sandrl.rollout.trajectory import Trajectory
from sandrl.sandbox.base import Sandbox
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.tasks.task import Task
from sandrl.train.buffer import GroupBuffer
from sandrl.train.command import run_training
from sandrl.train.group_sources import FileSource
from sandrl.train.session import Session, make_trainer
from sandrl.train.staleness import group_version, staleness
from sandrl.train.trainer import Trainer

from .conftest import run_config


class CountingAgent(LongTailAgent):
    """Samples, then sleeps 0.2 s in its sandbox; counts the generations it has received."""

    def __init__(self) -> None:
        super().__init__(CommandTimes(median_s=0.2, sigma=0.0), tokens=3)
        self.sampled = 0

    async def run(self, task: Task, sandbox: Sandbox, policy: InferenceClient | None, budget: Budget) -> AgentResult:
        assert policy is not None
        return await super().run(task, sandbox, _Counted(policy, self), budget)


class _Counted:
    """The policy's ``generate``, counted on the agent."""

    def __init__(self, policy: InferenceClient, agent: CountingAgent) -> None:
        self.policy, self.agent = policy, agent

    async def generate(self, input_ids: list[int], params: SamplingParams) -> Generation:
        generation = await self.policy.generate(input_ids, params)
        self.agent.sampled += 1
        return generation


class Record:
    """What the driver did: the groups each step trained, the samples each Trainer.step saw, the stale calls."""

    def __init__(self) -> None:
        self.agent = CountingAgent()
        self.trained: list[tuple[int, list[tuple[int, str, int | None]]]] = []
        """Per step: the trainer's version before it, and (position, group id, group version) of its groups."""
        self.samples: list[tuple[int, list[int]]] = []
        """Per Trainer.step: the version it started from and the weight version of every sample it trained."""
        self.stale: list[tuple[int, int]] = []
        """(position, trainer version) of every group found too stale."""


@pytest.fixture
def record(monkeypatch: pytest.MonkeyPatch) -> Record:
    rec = Record()
    train, step, stale = Session.train, Trainer.step, Session.stale

    async def spy_train(self: Session, items: Any, **extra: float) -> dict[str, Any]:
        rec.trained.append((self.version, [(p, g.group_id, group_version(g)) for p, g in items]))
        return await train(self, items, **extra)

    def spy_step(self: Trainer, batch: Any) -> Any:
        rec.samples.append((self.version, [s.weight_version for s in batch.samples]))
        # In the driver's worker thread, while the next groups start: let one of them sample first.
        sampled, deadline = rec.agent.sampled, time.monotonic() + 10
        while rec.agent.sampled == sampled and time.monotonic() < deadline:
            time.sleep(0.005)
        return step(self, batch)

    def spy_stale(self: Session, position: int) -> None:
        rec.stale.append((position, self.version))
        stale(self, position)

    monkeypatch.setattr(Session, "train", spy_train)
    monkeypatch.setattr(Trainer, "step", spy_step)
    monkeypatch.setattr(Session, "stale", spy_stale)
    return rec


def _metrics(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _position(group_id: str) -> int:
    return int(group_id.rsplit("#", 1)[1].split(".")[0])


def _first_not_in(positions: set[int]) -> int:
    return next(p for p in itertools.count() if p not in positions)


def _written(out: Path) -> dict[str, int | None]:
    """Every group the rollouts wrote, with its (oldest) weight version."""
    groups: dict[str, list[Trajectory]] = {}
    for t in read_jsonl(out / "rollouts.jsonl"):
        groups.setdefault(t.group_id, []).append(t)
    return {gid: group_version(Group(gid, ts[0].task_id, ts)) for gid, ts in groups.items()}


def _assert_never_trained_too_stale(rec: Record, bound: int) -> None:
    assert rec.samples, "no step ran"
    for version, weights in rec.samples:
        assert all(version - w <= bound for w in weights), (version, weights)
    for version, groups in rec.trained:
        assert all(v is None or version - v <= bound for _, _, v in groups), (version, groups)


async def _run(out: Path, rec: Record, provider: BwrapProvider, **async_: Any) -> list[dict[str, Any]]:
    config = run_config(out, run={"steps": 4}, **{"async": async_})  # 2 groups of 4 a step, 8 at once
    last = await run_training(config, mode="async", provider=provider, agent=rec.agent, console=Console(quiet=True))
    assert last["steps"] == 4
    return _metrics(out)


async def test_drop_counts_the_stale_groups_and_never_trains_them(
    tmp_path: Path, provider: BwrapProvider, record: Record
) -> None:
    out = tmp_path / "drop"
    lines = await _run(out, record, provider, max_staleness=0, on_stale="drop")
    written = _written(out)
    dropped = {p for p, _ in record.stale}
    print("dropped (position, trainer version):", record.stale)
    assert dropped, "max_staleness 0, a slow trainer: the groups started during a step must come back stale"
    assert lines[-1]["total_stale_dropped"] == len(record.stale) == len(dropped)
    assert lines[-1]["total_stale_regenerated"] == 0
    assert not any(".r" in gid for gid in written), "drop never runs a task again"
    trained = {p for _, groups in record.trained for p, _, _ in groups}
    assert not dropped & trained
    for position, version in record.stale:  # each was too old when the trainer looked
        (gid,) = [g for g in written if _position(g) == position]
        assert (v := written[gid]) is not None and version - v > 0, (gid, v, version)
    _assert_never_trained_too_stale(record, 0)
    assert all(set(m["staleness_hist"]) <= {"0"} for m in lines)
    # Dropped positions are consumed like trained ones: the data position (what a resumed run
    # starts from) is the first position neither trained nor dropped.
    assert lines[-1]["data_position"] == _first_not_in(trained | dropped)


async def test_regenerate_reruns_the_stale_groups_with_the_current_weights(
    tmp_path: Path, provider: BwrapProvider, record: Record
) -> None:
    out = tmp_path / "regenerate"
    lines = await _run(out, record, provider, max_staleness=0, on_stale="regenerate")
    written = _written(out)
    assert record.stale, "max_staleness 0, a slow trainer: the groups started during a step must come back stale"
    print("regenerated (position, trainer version):", record.stale)
    assert lines[-1]["total_stale_regenerated"] == len(record.stale)
    assert lines[-1]["total_stale_dropped"] == 0
    trained = {p: gid for _, groups in record.trained for p, gid, _ in groups}
    # Every position is trained exactly once, in order of the data: none is lost to staleness.
    positions = [p for _, groups in record.trained for p, _, _ in groups]
    assert len(positions) == len(set(positions)) == 4 * 2
    assert sorted(positions) == list(range(8))
    for position, version in record.stale:
        k = sum(1 for p, v in record.stale if p == position and v <= version)  # the k-th time it was stale
        again = next(g for g in written if _position(g) == position and g.endswith(f".r{k}"))
        assert (v := written[again]) is not None and v >= version, "re-issued with the weights of that moment"
    for position in {p for p, _ in record.stale}:
        assert ".r" in trained[position], f"position {position}: the stale group was trained, not its rerun"
    _assert_never_trained_too_stale(record, 0)
    assert lines[-1]["data_position"] == _first_not_in(set(trained))


async def test_pushes_every_update_interval_steps_within_the_bound(
    tmp_path: Path, provider: BwrapProvider, record: Record
) -> None:
    out = tmp_path / "interval"
    lines = await _run(out, record, provider, max_staleness=1, update_interval=2, on_stale="drop")
    pushed = {0} | {m["weight_version"] for m in lines if m["step"] % 2 == 0}
    sampled = {v for v in _written(out).values() if v is not None}
    assert sampled <= pushed, f"episodes carried versions {sampled}; only {pushed} were pushed"
    _assert_never_trained_too_stale(record, 1)
    assert lines[-1]["total_stale_dropped"] == len(record.stale)


# -- the buffer alone ----------------------------------------------------------------------------------


def _group(position: int, *versions: int | None) -> Group:
    gid = f"run/t#{position}"
    trajectories = [
        Trajectory(f"{gid}/{i}", gid, "t", i, "test", "completed", reward=float(i % 2), weight_version=v)
        for i, v in enumerate(versions)
    ]
    return Group(gid, "t", trajectories)


def test_a_group_is_as_stale_as_its_oldest_sample() -> None:
    assert group_version(_group(0, 3, 1, 2)) == 1 and staleness(_group(0, 3, 1, 2), 4) == 3
    assert group_version(_group(0, None, 2)) == 2
    assert group_version(_group(0, None, None)) is None and staleness(_group(0, None), 9) == 0


async def test_take_keeps_the_bound_and_drops_past_it(tmp_path: Path) -> None:
    """Version 3, bound 1: groups of versions 2 and 3 are trained, 1 and 0 dropped, in data order."""
    groups = [_group(0, 1, 1), _group(1, 3, 2), _group(2, 0, 3), _group(3, 3, 3), _group(4, None, None)]
    config = run_config(tmp_path, **{"async": {"max_staleness": 1, "on_stale": "drop"}})
    session = Session(config, FileSource(groups, limit=len(groups)), None, mode="async", console=Console(quiet=True))
    session.pushed_version = 3  # no trainer: the session's version is the one the inference side serves
    buffer = GroupBuffer(capacity=len(groups), max_staleness=1)
    producer = asyncio.create_task(buffer.fill(session))
    try:
        items, stats = await asyncio.wait_for(buffer.take(3, session), timeout=10)
    finally:
        producer.cancel()
        await asyncio.gather(producer, return_exceptions=True)
        session.close()
    assert sorted(p for p, _ in items) == [1, 3, 4]
    assert session.counters.stale_dropped == 2 and session.counters.stale_regenerated == 0
    # A dropped group is consumed (the data position passes it); one taken is consumed when trained.
    assert sorted(session._consumed | set(range(session._low))) == [0, 2]
    assert stats["buffer_fill"] == 3 / len(groups)


def test_a_resume_skips_the_groups_consumed_above_the_data_position(tmp_path: Path) -> None:
    """Async training consumes groups out of order: a resume rolls out what was in flight, nothing twice."""
    groups = [_group(p, 0, 0) for p in range(8)]
    config = run_config(tmp_path, **{"async": {"max_staleness": 1}})
    first = Session(
        config, FileSource(groups, limit=8), make_trainer(config), mode="async", console=Console(quiet=True)
    )
    try:
        assert [first.next_position() for _ in range(5)] == [0, 1, 2, 3, 4]
        for position in (0, 2, 3):  # 1 and 4 still in flight
            first.consumed(position)
        saved = first.save_checkpoint()
    finally:
        first.close()
    assert saved is not None and json.loads((saved / "state.json").read_text())["data_done"] == [2, 3]
    resumed_trainer = make_trainer(config)  # [run] resume: loads the newest checkpoint
    assert (resumed_trainer.data_position, resumed_trainer.data_done) == (1, (2, 3))
    second = Session(config, FileSource(groups, limit=8), resumed_trainer, mode="async", console=Console(quiet=True))
    try:
        assert [second.next_position() for _ in range(6)] == [1, 4, 5, 6, 7, None]
    finally:
        second.close()
