"""A run of 100k episodes opens in the viewer within the bound: its overview, the first page of its
episodes and one episode, read from a cold start (the index built from nothing).

The bound is on the CPU time the viewer spends (one thread does it all): on a quiet machine that
is its wall time, and other processes sharing the CPUs (the rest of a test run, a build) do not
make the test fail where the viewer did not get slower. The rest of the test run's objects are
frozen out of the garbage collector meanwhile: ``sandrl view`` runs in a process of its own, and a
long test run's heap made each of the viewer's full collections walk the suite's objects too
(2.4 s of CPU in one CI run against 1.4-1.5 s in a process of its own)."""

from __future__ import annotations

import gc
import json
import time
from pathlib import Path

from sandrl.rollout.jsonl import dumps
from sandrl.view.run_files import RunFiles
from sandrl.view.run_view import EpisodeQuery, RunView

from .runs import trajectory

EPISODES = 100_000
GROUP = 8
OPEN_BOUND_S = 2.0


def write_big_run(directory: Path) -> Path:
    """A synthetic run of :data:`EPISODES` episodes in groups of :data:`GROUP`, 16 per step."""
    directory.mkdir()
    lines = []
    for passed in (True, False):
        template = dumps(trajectory(0, 0, task="TASK", passed=passed))
        lines.append(template.replace("run/TASK#0/0", "run/TASK#{g}/{s}").replace("run/TASK#0", "run/TASK#{g}"))
    with (directory / "rollouts.jsonl").open("w") as file:
        for n in range(EPISODES):
            g, s = divmod(n, GROUP)
            line = lines[(g + s) % 2].replace("TASK", f"task-{g % 500}")
            file.write(line.replace("{g}", str(g)).replace("{s}", str(s)) + "\n")
    steps = EPISODES // GROUP // 2
    with (directory / "metrics.jsonl").open("w") as file:
        for step in range(1, steps + 1):
            record = {"step": step, "data_position": 2 * step, "reward_mean": 0.5, "total_episodes": 16 * step}
            file.write(json.dumps(record) + "\n")
    (directory / "config.toml").write_text('[model]\nname = "tiny"\n')
    return directory


def test_a_run_of_100k_episodes_opens_within_the_bound(tmp_path: Path) -> None:
    run_dir = write_big_run(tmp_path / "big")
    gc.collect()
    gc.freeze()  # the viewer's own process holds only its own objects
    try:
        started, wall = time.process_time(), time.perf_counter()
        view = RunView(RunFiles.open(run_dir))
        summary = view.summary()
        first = view.episodes(EpisodeQuery(status="failed", limit=50))
        episode = view.episode(EPISODES - 1)
        took, wall = time.process_time() - started, time.perf_counter() - wall
    finally:
        gc.unfreeze()
    assert summary["run"]["episodes"] == EPISODES and summary["run"]["unreadable_count"] == 0
    assert len(summary["tasks"]) == 500 and summary["statuses"]["passed"] == EPISODES // 2
    assert first["total"] == EPISODES // 2 and len(first["rows"]) == 50
    assert episode["episode_id"] == f"run/task-{(EPISODES - 1) // GROUP % 500}#{(EPISODES - 1) // GROUP}/7"
    assert episode["step"] == (EPISODES - 1) // GROUP // 2 + 1
    assert took < OPEN_BOUND_S, f"{EPISODES} episodes opened in {took:.2f} s of CPU ({wall:.2f} s)"
