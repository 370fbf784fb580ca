"""``[inference] launch`` under ``--ray``: the engines as Ray actors in a placement group, behind the driver's router.

Real everywhere but the agent (:class:`~tests.cluster.agents.ParityAgent`, two model calls per episode): the
engines are ``sandrl serve inference`` processes started by engine actors, the sandbox hosts are
``sandrl serve sandboxes`` processes, the router is the fleet's, served by the driver (this test process,
where a spy on :meth:`Router.pick` reads which engine each call went to).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandrl.cluster.config import ClusterConfig, ClusterOptions
from sandrl.cluster.engines import EngineGroup, engine_actor_name, router_host
from sandrl.cluster.training import run_cluster_training
from sandrl.errors import ClusterError, ConfigError
from sandrl.inference.fleet.proxy import FleetProxy
from sandrl.inference.fleet.router import Engine as RoutedEngine
from sandrl.inference.fleet.router import Router

from .agents import ParityAgent
from .conftest import SandboxHost
from .test_ray import _check_exactly_once, run_config

pytestmark = pytest.mark.slow


def cluster_config(hosts: dict[str, SandboxHost], **options: Any) -> ClusterConfig:
    opts = ClusterOptions(
        workers=2,
        worker_cpus=0.5,
        trainer_cpus=1.0,
        engine_cpus=0.5,
        trainer_threads=1,
        health_interval_s=0.2,
        worker_wait_s=60,
        **options,
    )
    return ClusterConfig(tuple(h.config() for h in hosts.values()), (), opts)


def _engine_processes(ports: set[int]) -> list[str]:
    """Command lines of live ``serve inference`` processes on one of ``ports`` (an engine, its guard)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv]
        if "inference" in words and "--port" in words and int(words[words.index("--port") + 1]) in ports:
            found.append(" ".join(words))
    return found


async def test_launched_engines_are_actors_in_a_placement_group_and_keep_each_episode(
    tmp_path: Path, ray_cluster: Any, both_up: dict[str, SandboxHost], monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray
    from ray.util.placement_group import placement_group_table

    picks: list[tuple[str | None, int]] = []
    routers: list[Router] = []
    pick = Router.pick

    def spy(self: Router, key: str | None) -> tuple[RoutedEngine, bool]:
        engine, moved = pick(self, key)
        picks.append((key, engine.index))
        if self not in routers:
            routers.append(self)
        return engine, moved

    monkeypatch.setattr(Router, "pick", spy)
    out = tmp_path / "engines"
    config = run_config(
        out,
        Path(""),
        run={"steps": 2},
        model={"token_file": ""},
        inference={"launch": "embedded", "engines": 2, "startup_timeout_s": 120, "weight_sync": "broadcast"},
    )
    before = set(placement_group_table())
    result = await run_cluster_training(
        config, cluster_config(both_up), address="auto", agent=ParityAgent(tokens=1, calls=2)
    )
    rollouts = _check_exactly_once(out, result, 2, 2, 4)
    groups = [g for key, g in placement_group_table().items() if key not in before]
    assert [(len(g["bundles"]), g["strategy"], g["state"]) for g in groups] == [(2, "PACK", "REMOVED")]
    assert [b for g in groups for b in g["bundles"].values()] == [{"CPU": 0.5}] * 2

    # Every episode's two calls went to one engine; both engines took episodes.
    by_episode: dict[str, set[int]] = {}
    for key, index in picks:
        assert key is not None, "a call reached the router without its episode's key"
        by_episode.setdefault(key, set()).add(index)
    assert set(by_episode) == {t.episode_id for t in rollouts}
    assert all(len(engines) == 1 for engines in by_episode.values()), by_episode
    assert len(picks) == 2 * len(rollouts)
    served_by = {key: next(iter(engines)) for key, engines in by_episode.items()}
    assert set(served_by.values()) == {0, 1}
    # The weights reached both engines: each served step 2's episodes at the version pushed after step 1.
    late = {served_by[t.episode_id] for t in rollouts if t.turns[0].weight_version == 1}
    assert late == {0, 1}, [(served_by[t.episode_id], t.turns[0].weight_version) for t in rollouts]
    for i in range(2):  # by a weight-update group with the trainer actor, not through the disk
        log = (out / "engines" / f"engine-{i}.log").read_text()
        assert '"POST /update_weights_from_distributed HTTP/1.1" 200' in log
        assert "/update_weights_from_disk" not in log
    assert not (out / "weights").exists()

    # Nothing is left: no engine answers, no engine process, no engine actor.
    (router,) = routers
    urls = [e.url for e in router.engines]
    ports = {int(u.rsplit(":", 1)[1]) for u in urls}
    assert all(u.startswith("http://127.0.0.1:") for u in urls), urls  # one machine: loopback
    assert router_host() == "127.0.0.1"  # and the router too (every node of this cluster is this machine)
    assert _engine_processes(ports) == []
    async with httpx.AsyncClient() as http:
        for url in urls:
            with pytest.raises(httpx.ConnectError):
                await http.get(url + "/health", timeout=2)
    run_id = out.name
    for i in range(2):
        for _ in range(50):
            try:
                ray.get_actor(engine_actor_name(run_id, i), namespace="sandrl")
            except ValueError:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"engine actor {i} outlived the run")


async def test_a_placement_group_larger_than_the_cluster_is_one_line(
    tmp_path: Path, ray_cluster: Any, both_up: dict[str, SandboxHost]
) -> None:
    config = run_config(
        tmp_path / "big",
        Path(""),
        model={"token_file": ""},
        inference={"launch": "sglang", "engines": 2, "gpus_per_engine": 1},
    )
    with pytest.raises(ClusterError) as caught:
        await run_cluster_training(config, cluster_config(both_up), address="auto", agent=ParityAgent(tokens=1))
    message = str(caught.value)
    assert "\n" not in message
    assert "needs 2 GPUs and the Ray cluster has 0" in message and "gpus_per_engine" in message


async def test_an_engine_actor_killed_outright_takes_its_engine_with_it(tmp_path: Path, ray_cluster: Any) -> None:
    """A crashed actor (``ray.kill``, no stop first) leaves no engine: its guard's parent was the actor."""
    import ray

    config = run_config(
        tmp_path / "crash", Path(""), model={"token_file": ""}, inference={"launch": "embedded", "engines": 1}
    )
    group = EngineGroup(config, ClusterOptions(engine_cpus=0.5, worker_wait_s=60), "crash")
    try:
        (url,) = await group.start()
        port = int(url.rsplit(":", 1)[1])
        async with httpx.AsyncClient() as http:
            assert (await http.get(url + "/health", timeout=5)).status_code == 200
        assert len(_engine_processes({port})) == 2  # the engine and its guard
        ray.kill(group.handles[0], no_restart=True)
        for _ in range(200):
            if not _engine_processes({port}):
                break
            await asyncio.sleep(0.1)
        assert _engine_processes({port}) == [], "the engine outlived its actor"
    finally:
        group.kill()


DRIVER = """
import asyncio, sys, time
import ray
from sandrl.cluster.config import ClusterOptions
from sandrl.cluster.engines import EngineGroup
from sandrl.train.run_config import from_dict

ray.init(address=sys.argv[1], namespace="sandrl", logging_level="WARNING", configure_logging=False)
run = from_dict({"run": {"output_dir": sys.argv[2]}, "tasks": {"family": "echo", "count": 2},
                 "inference": {"launch": "embedded", "engines": 1}})
urls = asyncio.run(EngineGroup(run, ClusterOptions(engine_cpus=0.5, worker_wait_s=60), "killed").start())
print(urls[0], flush=True)
time.sleep(600)
"""


async def test_no_engine_outlives_a_driver_killed_outright(tmp_path: Path, ray_cluster: Any) -> None:
    """``kill -9`` of the driver: Ray ends its job's actors, and each engine's guard ends its engine."""
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, ray_cluster.address, str(tmp_path / "out")],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert driver.stdout is not None
        url = await asyncio.wait_for(asyncio.to_thread(driver.stdout.readline), 120)
        port = int(url.strip().rsplit(":", 1)[1])
        assert len(_engine_processes({port})) == 2
        driver.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        driver.wait(timeout=30)
        for _ in range(600):
            if not _engine_processes({port}):
                break
            await asyncio.sleep(0.1)
        assert _engine_processes({port}) == [], "an engine outlived its driver"
        print(f"the engine was gone {time.monotonic() - killed:.1f} s after the driver's kill -9")
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        if driver.stdout is not None:
            driver.stdout.close()


async def test_an_engine_that_fails_to_start_says_why_and_leaves_nothing(tmp_path: Path, ray_cluster: Any) -> None:
    from ray.util.placement_group import placement_group_table

    config = run_config(
        tmp_path / "bad",
        Path(""),
        model={"token_file": ""},
        inference={"launch": "embedded", "engines": 1, "args": ["--no-such-flag"], "max_restarts": 0},
    )
    group = EngineGroup(config, ClusterOptions(engine_cpus=0.5, worker_wait_s=60), "bad")
    before = set(placement_group_table())
    with pytest.raises(ConfigError) as caught:
        await group.start()
    assert "inference engine 0 exited with status" in str(caught.value)
    assert "--no-such-flag" in str(caught.value)  # the engine's own complaint, from its log's tail
    assert group.handles == [] and group.group is None
    assert [g["state"] for key, g in placement_group_table().items() if key not in before] == ["REMOVED"]


def test_a_router_that_other_hosts_reach_needs_a_token() -> None:
    with pytest.raises(ConfigError, match="needs a token"):
        FleetProxy(Router(["http://127.0.0.1:9"]), remote=True)
