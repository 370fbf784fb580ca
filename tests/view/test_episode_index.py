"""The episode index: what it reads of each line, as the run appends, and what it refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandrl.rollout.jsonl import dumps
from sandrl.view import episode_index
from sandrl.view.episode_index import EpisodeIndex

from .runs import trajectory


def test_a_summary_first_line_is_read_from_its_head_and_says_what_the_whole_line_says(tmp_path: Path) -> None:
    t = trajectory(3, 1, passed=False, status="truncated", stop_reason="max_turns")
    line = dumps(t).encode()
    assert line.find(episode_index.HEAD_END) < line.find(b'"turns"')  # the bulk comes after the head
    whole = json.loads(line)
    head = episode_index._summary(line)
    assert "ids" not in head and "turns" not in head
    keys = ("episode_id", "group_id", "task_id", "status", "stop_reason", "reward", "passed", "timings", "task_set")
    for key in keys:
        assert head[key] == whole[key]


def test_a_line_in_the_old_order_is_read_whole(tmp_path: Path) -> None:
    data = trajectory(0, 0).to_dict()
    old = {k: data[k] for k in ("episode_id", "group_id", "task_id", "sample_index", "agent", "status", "ids")}
    old.update({k: v for k, v in data.items() if k not in old})
    path = tmp_path / "rollouts.jsonl"
    path.write_text(json.dumps(old, separators=(",", ":")) + "\n")
    index = EpisodeIndex(path)
    assert index.refresh() == 1
    assert index.task_set == ["family"] and index.read(0) == trajectory(0, 0)


def test_the_index_reads_what_is_appended_and_leaves_a_line_not_yet_ended(tmp_path: Path) -> None:
    path = tmp_path / "rollouts.jsonl"
    first, second = dumps(trajectory(0, 0)), dumps(trajectory(1, 0, task="u", passed=False))
    path.write_text(first + "\n" + second[:40])
    index = EpisodeIndex(path)
    assert index.refresh() == 1
    with path.open("a") as file:
        file.write(second[40:] + "\n")
    assert index.refresh() == 1
    assert index.task_id == ["t", "u"] and index.passed == [True, False] and index.position == [0, 1]
    assert index.read(1).task_id == "u"
    path.write_text(second + "\n")  # replaced by a shorter file: a new run in the same place
    assert index.refresh() == 1 and index.task_id == ["u"]


def test_lines_that_are_not_episodes_are_counted_and_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(episode_index, "MAX_LINE_BYTES", 2000)
    path = tmp_path / "rollouts.jsonl"
    good = dumps(trajectory(0, 0))
    path.write_text("\n".join(["not json", '{"episode_id": 1}', "[1, 2]", "x" * 5000, good, ""]))
    index = EpisodeIndex(path)
    index.refresh()
    assert len(index) == 1 and index.head(0)["episode_id"] == "run/t#0/0"
    assert index.unreadable_count == 4
    assert any("bound" in why for why in index.unreadable)


def test_each_group_is_placed_in_the_step_whose_data_position_passed_it(tmp_path: Path) -> None:
    path = tmp_path / "rollouts.jsonl"
    groups = [0, 1, 2, 3, 4, 5]
    path.write_text("".join(dumps(trajectory(g, 0)) + "\n" for g in groups))
    path.write_text(path.read_text() + dumps(trajectory(1, 0, group_id="run/t#1.r1", episode_id="run/t#1.r1/0")) + "\n")
    index = EpisodeIndex(path)
    index.refresh()
    # step 1 trained positions 0-1, step 2 positions 2-3; 4 and 5 are in flight.
    assert index.steps([2, 4]) == [1, 1, 2, 2, None, None, 1]
    assert index.steps([]) == [None] * 7
