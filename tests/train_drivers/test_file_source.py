"""``--load-rollouts`` after a resumed async run: a group id written twice is two groups, not one of twice the size."""

from __future__ import annotations

from pathlib import Path

from sandrl.rollout.jsonl import write_jsonl
from sandrl.rollout.trajectory import Trajectory
from sandrl.train.group_sources import FileSource


def _group(group_id: str, n: int, version: int) -> list[Trajectory]:
    return [
        Trajectory(f"{group_id}/{i}", group_id, "t", i, "test", "completed", reward=i % 2, weight_version=version)
        for i in range(n)
    ]


def test_a_group_rolled_out_again_by_a_resumed_run_stays_a_group_of_its_own(tmp_path: Path) -> None:
    # The first run wrote #0 and #1, then #2 (ready but untrained when it stopped); the resumed run
    # starts again at position 2 with the same group id and other weights.
    path = tmp_path / "rollouts.jsonl"
    write_jsonl(path, [*_group("run/t#0", 2, 0), *_group("run/t#1", 2, 0), *_group("run/t#2", 2, 1)])
    rerun = tmp_path / "rerun.jsonl"
    write_jsonl(rerun, [*reversed(_group("run/t#2", 2, 3)), *_group("run/t#3", 2, 3)])
    with path.open("a") as out:
        out.write(rerun.read_text())
    source = FileSource.read(path)
    assert [g.group_id for g in source.groups] == ["run/t#0", "run/t#1", "run/t#2", "run/t#2", "run/t#3"]
    assert all([t.sample_index for t in g.trajectories] == [0, 1] for g in source.groups)
    assert [g.trajectories[0].weight_version for g in source.groups] == [0, 0, 1, 3, 3]
    assert source.limit == 5
