"""[[tasks.sources]]: the mix each data position draws from, its statistics, its report, and its bad input."""

from __future__ import annotations

import collections
import io
import math
import random
import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from sandrl.errors import ConfigError
from sandrl.rollout.runner import Group
from sandrl.rollout.trajectory import Trajectory
from sandrl.train.mix_report import MixReport
from sandrl.train.run_config import from_dict, load_run_config, save_resolved
from sandrl.wiring import task_mix, task_set
from sandrl.wiring.config import TasksConfig, TaskSource
from sandrl.wiring.task_mix import TaskMix


def _sources(**tables: dict[str, Any]) -> TasksConfig:
    return TasksConfig(sources=tuple(TaskSource(**t) for t in tables.values()))


def _finite(tmp_path: Path, echo: tuple[int, int, float], arith: tuple[int, int, float]) -> TaskMix:
    """A mix of echo and arith tasks, each (count, epochs, weight), seed 0."""
    config = _sources(
        echo={"family": "echo", "count": echo[0], "epochs": echo[1], "weight": echo[2]},
        arith={"family": "arith", "count": arith[0], "epochs": arith[1], "weight": arith[2]},
    )
    return task_mix(config, tmp_path, 0)


def three_to_one(tmp_path: Path, seed: int = 0, **arith: Any) -> TaskMix:
    config = _sources(echo={"family": "echo", "count": 8, "weight": 3}, arith={"family": "arith", "count": 4, **arith})
    return task_mix(config, tmp_path / "tasks", seed)


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_two_sources_at_3_to_1_realise_3_to_1_within_sampling_error(tmp_path: Path, seed: int) -> None:
    mix = three_to_one(tmp_path, seed)
    n = 4000
    drawn = [mix.source_at(p).name for p in range(n)]
    share = drawn.count("echo") / n
    assert abs(share - 0.75) < 4 * math.sqrt(0.75 * 0.25 / n), share  # 4 standard errors: 0.027
    # Drawn at random, not in a fixed pattern: the four positions of a step are not always 3 + 1.
    assert len({tuple(drawn[i : i + 4]) for i in range(0, 400, 4)}) > 4
    # Each source goes through its own tasks a pass at a time, each pass a new shuffle.
    for name, count in (("echo", 8), ("arith", 4)):
        ids = [mix.task_at(p).id for p in range(n) if drawn[p] == name]
        passes = [ids[i : i + count] for i in range(0, len(ids) - count + 1, count)]
        assert all(sorted(p) == sorted(passes[0]) and len(set(p)) == count for p in passes)
        assert len({tuple(p) for p in passes}) > 1


def test_a_position_draws_the_same_task_whatever_was_asked_before_it(tmp_path: Path) -> None:
    """What a resumed run (it asks from its data position on) and a cluster's driver rely on."""
    in_order = three_to_one(tmp_path, 7)
    expected = [in_order.task_at(p).id for p in range(300)]
    resumed = task_mix(TasksConfig(sources=in_order_config()), tmp_path / "again", 7)
    assert [resumed.task_at(p).id for p in reversed(range(300))] == expected[::-1]
    other_seed = three_to_one(tmp_path / "other", 8)
    assert [other_seed.task_at(p).id for p in range(300)] != expected


def in_order_config() -> tuple[TaskSource, ...]:
    return (TaskSource(family="echo", count=8, weight=3), TaskSource(family="arith", count=4))


def test_one_task_set_draws_the_order_runs_always_had(tmp_path: Path) -> None:
    family = TasksConfig(family="echo", count=5)
    tasks = task_set(family, tmp_path / "a")
    mix = task_mix(family, tmp_path / "a", 3)
    assert not mix.mixed and mix.limit is None

    def before(position: int) -> str:  # group_sources.task_at as it was
        epoch, index = divmod(position, len(tasks))
        order = list(range(len(tasks)))
        random.Random(f"sandrl.train:3:{epoch}").shuffle(order)
        return tasks[order[index]].id

    assert [mix.task_at(p).id for p in range(23)] == [before(p) for p in range(23)]
    assert mix.first_pass() == [mix.task_at(p) for p in range(5)]
    one = task_mix(TasksConfig(sources=(TaskSource(family="echo", count=5),)), tmp_path / "b", 3)
    assert [t.id for t in map(one.task_at, range(23))] == [before(p) for p in range(23)]


def test_a_source_runs_out_after_its_epochs_and_the_mix_ends_when_all_have(tmp_path: Path) -> None:
    mix = three_to_one(tmp_path, 0, epochs=2)
    assert mix.limit is None
    drawn = [mix.source_at(p).name for p in range(400)]
    assert drawn.count("arith") == 8
    last = mix.ran_out_at("arith")
    assert last is not None and drawn[last] == "arith" and "arith" not in drawn[last + 1 :]
    assert collections.Counter(mix.task_at(p).id for p in range(400) if drawn[p] == "arith") == {
        t.id: 2 for t in mix.sources[1].tasks
    }
    ended = _finite(tmp_path / "ended", (3, 1, 1.0), (2, 3, 1.0))
    assert ended.limit == 9
    assert collections.Counter(ended.task_at(p).id for p in range(9)) == {
        **{t.id: 1 for t in ended.sources[0].tasks},
        **{t.id: 3 for t in ended.sources[1].tasks},
    }
    with pytest.raises(IndexError):
        ended.task_at(9)
    assert {t.id for t in ended.first_pass()} == {t.id for t in ended.tasks}


def _group(task_id: str, rewards: list[float], status: str = "completed") -> Group:
    trajectories = [
        Trajectory.from_dict(
            {
                "episode_id": f"r/{task_id}#0/{i}",
                "group_id": f"r/{task_id}#0",
                "task_id": task_id,
                "sample_index": i,
                "agent": "scripted",
                "status": status,
                "reward": None if status == "infra_error" else r,
                "passed": r == 1.0,
                "ids": [1, 2],
                "loss_mask": [0, 1],
            }
        )
        for i, r in enumerate(rewards)
    ]
    return Group(f"r/{task_id}#0", task_id, trajectories)


def test_each_step_has_per_source_metrics_and_a_source_that_runs_out_is_said_once(tmp_path: Path) -> None:
    mix = _finite(tmp_path, (4, 0, 3.0), (1, 1, 1.0))
    assert [mix.source_at(p).name for p in range(6)] == ["echo", "arith", "echo", "echo", "echo", "echo"]
    out = io.StringIO()
    report = MixReport.of(mix, Console(file=out, width=400), 0, set())
    assert report is not None

    def groups(*positions: int) -> list[tuple[int, Group]]:
        rewards = {"echo": [1.0, 0.0, 1.0, 1.0], "arith": [0.0, 1.0]}
        return [(p, _group(mix.task_at(p).id, rewards[mix.source_at(p).name])) for p in positions]

    # Step 1 trains positions 0 and 2; the arith group at 1 is still in flight (async).
    metrics = report.step(groups(0, 2), 1, {2})
    assert metrics == {
        "source/echo/groups": 2,
        "source/echo/episodes": 8,
        "source/echo/reward_mean": 0.75,
        "source/echo/pass_rate": 0.75,
        "source/echo/weight": 0.75,
        "source/echo/groups_total": 2,
        "source/echo/share": 1.0,
        "source/arith/groups": 0,
        "source/arith/episodes": 0,
        "source/arith/weight": 0.25,
        "source/arith/groups_total": 0,
        "source/arith/share": 0.0,
        "source/arith/ran_out": 0.0,
    }
    assert out.getvalue() == ""
    metrics = report.step(groups(1, 3), 4, set())
    assert metrics["source/arith/reward_mean"] == 0.5 and metrics["source/arith/episodes"] == 2
    assert metrics["source/arith/share"] == 0.25 and metrics["source/arith/ran_out"] == 1.0
    assert out.getvalue().count("\n") == 1
    assert "source 'arith' ran out: each of its 1 tasks was drawn 1 time(s)" in out.getvalue()
    assert "the mix goes on with echo" in out.getvalue()
    metrics = report.step(groups(4, 5), 6, set())
    assert metrics["source/arith/ran_out"] == 1.0 and metrics["source/echo/groups_total"] == 5
    assert out.getvalue().count("ran out") == 1
    # A run resumed after it ran out does not say it again, and counts the run's groups from position 0.
    again = io.StringIO()
    resumed = MixReport.of(mix, Console(file=again), 6, set())
    assert resumed is not None
    assert resumed.step(groups(6), 7, set())["source/echo/share"] == 6 / 7
    assert again.getvalue() == ""


def test_the_end_of_the_whole_mix_is_said(tmp_path: Path) -> None:
    mix = _finite(tmp_path, (1, 1, 1.0), (1, 1, 1.0))
    out = io.StringIO()
    report = MixReport.of(mix, Console(file=out, width=400), 0, set())
    assert report is not None
    metrics = report.step([(p, _group(mix.task_at(p).id, [1.0, 0.0])) for p in (0, 1)], 2, set())
    assert metrics["source/echo/share"] == metrics["source/arith/share"] == 0.5
    assert "every source of [[tasks.sources]] has run out, after 2 groups" in out.getvalue()
    assert MixReport.of(task_mix(TasksConfig(family="echo", count=2), tmp_path / "one", 0), Console(), 0, set()) is None


def _load(tmp_path: Path, tasks: str) -> Any:
    config = tmp_path / "run.toml"
    config.write_text(f'[run]\noutput_dir = "{tmp_path / "out"}"\n{tasks}')
    return load_run_config(config)


@pytest.mark.parametrize(
    ("tasks", "message"),
    [
        ('[[tasks.sources]]\nfamily = "echo"\nweight = 0\n', "weight must be a positive number"),
        ('[[tasks.sources]]\nfamily = "echo"\nweight = -2\n', "weight must be a positive number"),
        ('[[tasks.sources]]\nfamily = "echo"\nweight = nan\n', "weight must be a positive number"),
        (
            '[[tasks.sources]]\nfamily = "echo"\n[[tasks.sources]]\nfamily = "echo"\nseed = 1\n',
            "two [[tasks.sources]] are named 'echo': give each one a name",
        ),
        (
            '[tasks]\npath = "builtin"\n[[tasks.sources]]\nfamily = "echo"\n',
            "path = 'builtin' and [[tasks.sources]] both say what to train on: move path = 'builtin' into a [[tasks",
        ),
        (
            '[tasks]\nfamily = "arith"\n[[tasks.sources]]\nfamily = "echo"\n',
            "family = 'arith' and [[tasks.sources]] both say what to train on",
        ),
        ('[tasks]\ncount = 4\n[[tasks.sources]]\nfamily = "echo"\n', "count and seed go in each source table"),
        ('[[tasks.sources]]\nfamily = "echo"\nepochs = -1\n', "epochs must be >= 0"),
        ('[[tasks.sources]]\nfamily = "echoo"\n', "family must be one of"),
        ("[[tasks.sources]]\nweight = 2\n", "exactly one of path"),
        ('[[tasks.sources]]\nfamily = "echo"\nname = "a/b"\n', "cannot name a source: give the table name"),
        ('[[tasks.sources]]\npath = "."\n', "cannot name a source: give the table name"),
        ('[[tasks.sources]]\nfamily = "echo"\nwieght = 2\n', "unknown key(s) wieght"),
        (
            '[warm_start]\nenabled = true\n[[tasks.sources]]\nfamily = "echo"\n',
            "set [warm_start] path to a task set with solutions",
        ),
    ],
)
def test_bad_sources_are_refused_in_one_line_naming_the_fix(tmp_path: Path, tasks: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, tasks)
    assert message in caught.value.message and "\n" not in caught.value.message


def test_a_missing_path_or_a_task_in_two_sources_is_refused_when_the_tasks_load(tmp_path: Path) -> None:
    two = '[[tasks.sources]]\nfamily = "echo"\n[[tasks.sources]]\npath = "datasets/tb"\nweight = 3\n'
    config = _load(tmp_path, two)
    with pytest.raises(ConfigError) as caught:
        task_set(config.tasks, tmp_path / "tasks")
    assert caught.value.message == (
        f"[[tasks.sources]] 'tb': path {tmp_path / 'datasets' / 'tb'} does not exist: give a task directory, a "
        "directory of them, a row file or 'builtin' (a relative path is relative to the config file)"
    )
    task_set(TasksConfig(family="echo", count=2), tmp_path / "datasets" / "tb")
    twice = _load(tmp_path, '[[tasks.sources]]\nfamily = "echo"\ncount = 2\n[[tasks.sources]]\npath = "datasets/tb"\n')
    with pytest.raises(ConfigError, match=re.escape("task id 'echo-0-0000' is in [[tasks.sources]] 'echo' and 'tb'")):
        task_set(twice.tasks, tmp_path / "tasks")


def test_the_sources_are_saved_with_the_run_and_read_back_unchanged(tmp_path: Path) -> None:
    (tmp_path / "sets" / "mine.jsonl").parent.mkdir()
    config = _load(
        tmp_path,
        '[[tasks.sources]]\npath = "sets/mine.jsonl"\nweight = 3\n[[tasks.sources]]\nfamily = "arith"\nepochs = 2\n',
    )
    first, second = config.tasks.sources
    assert (first.name, first.path, first.weight) == ("mine", str(tmp_path / "sets" / "mine.jsonl"), 3.0)
    assert (second.name, second.epochs) == ("arith", 2)
    assert TaskSource(path="datasets/terminal-bench@2.0/").name == "terminal-bench@2.0"  # what tasks pull writes
    saved = save_resolved(config)
    assert "[[tasks.sources]]" in saved.read_text()
    assert load_run_config(saved) == config
    assert from_dict(config.to_dict()) == config
