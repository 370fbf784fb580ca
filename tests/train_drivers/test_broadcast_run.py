"""``sandrl train`` with two embedded engines launched from ``[inference]``: every weight push travels through
a weight-update group to both engines (shared memory: they are on this host; no checkpoint is written), and the
episodes after it are sampled by it."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandrl.inference.weight_push import DEFAULT_BUCKET_BYTES
from sandrl.inference.weight_shm import shm_room
from sandrl.rollout.jsonl import read_jsonl
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.train.command import run_training

from .conftest import ParityAgent, run_config

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("sync", ["auto"])  # the disk path of a fleet: tests/inference/fleet
async def test_a_run_with_two_launched_engines_pushes_its_weights_by_broadcast(
    tmp_path: Path, provider: BwrapProvider, sync: str
) -> None:
    out = tmp_path / "run"
    config = run_config(
        out,
        run={"steps": 2, "groups_per_step": 1},
        tasks={"family": "echo", "count": 4},
        rollout={"group_size": 4, "concurrency": 4, "max_turns": 1, "max_new_tokens": 4},
        inference={"launch": "embedded", "engines": 2, "startup_timeout_s": 180, "weight_sync": sync},
    )
    await run_training(config, provider=provider, agent=ParityAgent())  # its groups carry a signal
    episodes = read_jsonl(out / "rollouts.jsonl")
    assert {t.weight_version for t in episodes} == {0, 1}  # step 2 sampled by the pushed weights
    assert not [t for t in episodes if t.status == "error"]
    logs = [(out / "engines" / f"engine-{i}.log").read_text() for i in range(2)]
    on_this_host = "shm" if shm_room() >= DEFAULT_BUCKET_BYTES else "gloo"  # a container's small /dev/shm: gloo
    for log in logs:
        if sync == "auto":
            assert '"POST /update_weights_from_distributed HTTP/1.1" 200' in log
            assert f"(backend {on_this_host})" in log  # engines on the trainer's host: /dev/shm, not gloo's TCP
            assert "/update_weights_from_disk" not in log
        else:
            assert '"POST /update_weights_from_disk HTTP/1.1" 200' in log
            assert "/update_weights_from_distributed" not in log
    assert (out / "weights").exists() == (sync == "disk")
