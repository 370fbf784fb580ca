"""Training over a local Ray cluster (a head and a second node) and two sandbox hosts of different capacities.

Real everywhere but the agent (:class:`~tests.cluster.agents.ParityAgent`): the sandbox hosts are
``sandrl serve sandboxes`` processes, the policy is the tiny engine behind a real HTTP server,
rollout workers and the trainer are Ray actors, the drivers are the ones of one machine.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from sandrl.cluster.config import ClusterConfig, ClusterOptions
from sandrl.cluster.training import run_cluster_training
from sandrl.inference.engine import Engine
from sandrl.rollout.jsonl import read_jsonl
from sandrl.rollout.trajectory import Trajectory
from sandrl.train.run_config import RunConfig, from_dict

from .agents import ParityAgent
from .conftest import SandboxHost

pytestmark = pytest.mark.slow


def expected_reward(engine: Engine) -> float:
    """The parity agent's expected reward under the served weights: P(the first sampled token is even)."""
    import torch

    agent = ParityAgent(tokens=1)
    prompt = agent.tokenizer.encode_messages([{"role": "user", "content": "pick"}], add_generation_prompt=True)
    with torch.no_grad():
        logits = engine.model(torch.tensor([prompt])).logits[0, -1].float()
    probs = torch.softmax(logits, dim=-1)
    return float(probs[0::2].sum())


def run_config(out: Path, token_file: Path, **sections: dict[str, Any]) -> RunConfig:
    data: dict[str, dict[str, Any]] = {
        "run": {"output_dir": str(out), "steps": 3, "groups_per_step": 2},
        "model": {"token_file": str(token_file)},  # the inference server's token
        "tasks": {"family": "echo", "count": 8},
        "rollout": {"group_size": 4, "concurrency": 8, "max_turns": 1, "max_new_tokens": 8, "max_attempts": 4},
        "train": {"lr": 3e-2, "loss": {"loss_type": "dapo"}},
    }
    for name, table in sections.items():
        data.setdefault(name, {}).update(table)
    return from_dict(data)


def cluster_config(hosts: dict[str, SandboxHost], url: str) -> ClusterConfig:
    options = ClusterOptions(
        workers=2, worker_cpus=0.5, trainer_cpus=1.0, trainer_threads=1, health_interval_s=0.2, worker_wait_s=60
    )
    return ClusterConfig(tuple(h.config() for h in hosts.values()), (url,), options)


def _metrics(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _check_exactly_once(out: Path, result: dict[str, Any], steps: int, groups: int, size: int) -> list[Trajectory]:
    """Every step trained a full batch; every episode id is in rollouts.jsonl once and trained at most once."""
    rollouts = read_jsonl(out / "rollouts.jsonl")
    ids = [t.episode_id for t in rollouts]
    assert len(ids) == len(set(ids)), "an episode was delivered twice"
    c = result["cluster"]
    assert c["ledger"]["episodes_delivered"] == len(ids)
    assert c["episodes_trained"] == c["episodes_trained_unique"], "the trainer saw an episode twice"
    lines = _metrics(out)
    assert [m["step"] for m in lines] == list(range(1, steps + 1))
    assert all(m["groups"] == groups for m in lines)
    assert lines[-1]["total_infra_errors"] == 0, "an episode was lost: it ended in an infra error"
    by_group: dict[str, int] = {}
    for t in rollouts:
        by_group[t.group_id] = by_group.get(t.group_id, 0) + 1
    assert set(by_group.values()) == {size}
    return rollouts


async def test_async_training_over_the_cluster_learns_and_places_by_capacity(
    tmp_path: Path,
    ray_cluster: Any,
    both_up: dict[str, SandboxHost],
    served: tuple[Engine, str],
    inference_token_file: Path,
) -> None:
    engine, inference_url = served
    before = expected_reward(engine)
    out = tmp_path / "learn"
    # 10 steps reached +0.13 once in CI (0.99 in most runs): 20 keep the +0.2 bar clear of that tail.
    steps = 20
    config = run_config(
        out, inference_token_file, run={"steps": steps, "mode": "async"}, **{"async": {"max_staleness": 1}}
    )
    started = time.monotonic()
    result = await run_cluster_training(
        config, cluster_config(both_up, inference_url), address="auto", agent=ParityAgent(tokens=1, work_s=0.5)
    )
    print(f"async cluster run: {time.monotonic() - started:.1f} s")
    rollouts = _check_exactly_once(out, result, steps, 2, 4)
    rewards = [m["reward_mean"] for m in _metrics(out)]
    after = expected_reward(engine)  # the weights the trainer pushed last
    print(f"expected reward {before:.3f} -> {after:.3f}; per step {rewards}")
    assert engine.weight_version == result["weight_version"] >= 5
    assert after > before + 0.2, (before, after, rewards)
    hosts = result["cluster"]["hosts"]
    assert hosts["a"]["placements"] > 1.5 * hosts["b"]["placements"], hosts  # capacity 3 against 1
    placed = {
        name: sum(t.sandbox_id is not None and t.sandbox_id.startswith(name + "/") for t in rollouts)
        for name in ("a", "b")
    }
    assert placed["a"] > placed["b"] > 0, placed
    assert both_up["a"].live() == 0 and both_up["b"].live() == 0, "a sandbox was left open"


async def _wait_for(check: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.05)


async def test_killing_a_sandbox_host_mid_run_loses_duplicates_and_misscores_nothing(
    tmp_path: Path, ray_cluster: Any, both_up: dict[str, SandboxHost], inference_url: str, inference_token_file: Path
) -> None:
    out = tmp_path / "host-dies"
    config = run_config(out, inference_token_file, run={"steps": 4, "mode": "async"})
    run = asyncio.ensure_future(
        run_cluster_training(
            config, cluster_config(both_up, inference_url), address="auto", agent=ParityAgent(work_s=1.0)
        )
    )
    b = both_up["b"]
    await _wait_for(lambda: b.live() >= 1 or run.done())
    assert not run.done()
    killed_at = time.time()
    b.kill()
    result = await run
    rollouts = _check_exactly_once(out, result, 4, 2, 4)
    lost = [t for t in rollouts if any(e.error_code == "sandbox_host_lost" for e in t.retried_errors)]
    assert lost, "the episodes on the dead host were retried"
    for t in lost:
        first = next(e for e in t.retried_errors if e.error_code == "sandbox_host_lost")
        assert "sandbox host b" in first.message and t.status != "infra_error" and t.attempt >= 2
        assert t.sandbox_id is not None and t.sandbox_id.startswith("a/"), "the retry ran on the live host"
    for t in rollouts:
        if t.sandbox_id is not None and t.sandbox_id.startswith("b/"):
            assert t.started_at + t.timings.total_s <= killed_at + 0.5, f"{t.episode_id} was scored on the dead host"
    hosts = result["cluster"]["hosts"]
    assert hosts["b"]["failures"] >= 1 and hosts["b"]["down_events"] >= 1
    assert both_up["a"].live() == 0


async def test_killing_a_rollout_worker_mid_run_reissues_its_groups(
    tmp_path: Path, ray_cluster: Any, both_up: dict[str, SandboxHost], inference_url: str, inference_token_file: Path
) -> None:
    import ray

    from sandrl.cluster.ray import worker_name

    out = tmp_path / "worker-dies"
    config = run_config(out, inference_token_file, run={"steps": 4, "mode": "async"})
    run = asyncio.ensure_future(
        run_cluster_training(
            config, cluster_config(both_up, inference_url), address="auto", agent=ParityAgent(work_s=1.0)
        )
    )
    name = worker_name("worker-dies", 0)
    worker = None
    deadline = time.monotonic() + 60
    while worker is None:
        assert time.monotonic() < deadline and not run.done()
        try:
            worker = ray.get_actor(name, namespace="sandrl")
        except ValueError:
            await asyncio.sleep(0.1)
    while (metrics := await worker.metrics.remote())["in_flight"] == 0:
        assert time.monotonic() < deadline and not run.done()
        await asyncio.sleep(0.1)
    os.kill(metrics["pid"], signal.SIGKILL)
    result = await run
    _check_exactly_once(out, result, 4, 2, 4)
    c = result["cluster"]
    assert c["worker_losses"] >= 1 and c["ledger"]["reissues"] >= 1, c
    assert c["workers_alive"] == 2, "Ray restarted the worker"
    await _wait_for(lambda: both_up["a"].live() == 0 and both_up["b"].live() == 0, 30)


async def test_two_training_ranks_in_a_placement_group_train_the_run_exactly_once(
    tmp_path: Path,
    ray_cluster: Any,
    both_up: dict[str, SandboxHost],
    served: tuple[Engine, str],
    inference_token_file: Path,
) -> None:
    """``[train] processes = 2`` under --ray: two rank actors (FSDP2 over gloo) are the trainer; the drivers
    do not change, and every episode is trained once."""
    from ray.util.placement_group import placement_group_table

    out = tmp_path / "ranks"
    config = run_config(out, inference_token_file, run={"steps": 2}, train={"processes": 2})
    before = set(placement_group_table())
    result = await run_cluster_training(
        config, cluster_config(both_up, served[1]), address="auto", agent=ParityAgent(tokens=1)
    )
    groups = [g for key, g in placement_group_table().items() if key not in before]
    assert [(len(g["bundles"]), g["strategy"], g["state"]) for g in groups] == [(2, "PACK", "REMOVED")]
    _check_exactly_once(out, result, 2, 2, 4)
    assert result["weight_version"] >= 1 and (out / "checkpoints" / "step-00000002" / "state").is_dir()
