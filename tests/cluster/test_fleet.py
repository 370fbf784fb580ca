"""FleetProvider over two real sandbox hosts: placement by capacity, failover, recovery, per-host metrics."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from sandrl.capacity import slots_from_file
from sandrl.cluster.fleet import FleetConfig, FleetProvider, FleetSandbox
from sandrl.cluster.hosts import HostConfig
from sandrl.errors import ConfigError, SandboxHostLostError
from sandrl.rollout.failures import classify
from sandrl.sandbox.base import SandboxSpec

from ..bench.conftest import synthetic_result
from .conftest import SandboxHost

FAST = FleetConfig(health_interval_s=0.2, health_timeout_s=5.0)
"""Checks often; a generous timeout: a loaded CI box can take over 1 s to answer /healthz, and a host
that fails it leaves placement (seen: 7 of 8 creates on a, not 6)."""
SPEC = SandboxSpec(memory_mb=256, ttl_s=300)


def _host_of(sandbox: FleetSandbox) -> str:
    return sandbox.id.split("/", 1)[0]


async def test_placement_follows_capacity_and_running_commands(both_up: dict[str, SandboxHost]) -> None:
    hosts = [h.config() for h in both_up.values()]
    async with FleetProvider(hosts, FAST) as fleet:
        made = [await fleet.create(SPEC) for _ in range(8)]
        try:
            placed = [_host_of(s) for s in made]
            assert placed.count("a") == 6 and placed.count("b") == 2, placed  # 3 : 1, as the capacities
            assert both_up["a"].live() == 6 and both_up["b"].live() == 2
            m = fleet.metrics()
            assert (m["a"]["placements"], m["a"]["live"], m["b"]["live"]) == (6, 6, 2)
            # A running command counts as load: with one busy sandbox on b, the next two go to a.
            b_sandbox = next(s for s in made if _host_of(s) == "b")
            busy = asyncio.ensure_future(b_sandbox.exec("sleep 2", timeout_s=10))
            await asyncio.sleep(0.5)
            assert fleet.metrics()["b"]["running"] == 1
            more = [await fleet.create(SPEC) for _ in range(2)]
            made += more
            assert [_host_of(s) for s in more] == ["a", "a"]
            assert (await busy).exit_code == 0
            for s in made[:3]:
                await s.exec("true")
            assert fleet.metrics()["a"]["commands"] >= 2 and fleet.metrics()["a"]["command_p95_s"] > 0
        finally:
            await asyncio.gather(*(s.close() for s in made))
        assert fleet.metrics()["a"]["live"] == 0 and both_up["a"].live() == 0


async def test_a_dead_host_is_skipped_and_put_back_when_it_recovers(both_up: dict[str, SandboxHost]) -> None:
    a, b = both_up["a"], both_up["b"]
    async with FleetProvider([a.config(), b.config()], FAST) as fleet:
        made = [await fleet.create(SPEC) for _ in range(4)]
        assert [_host_of(s) for s in made] == ["a", "a", "a", "b"]  # the most free capacity first
        lost = made[3]
        b.kill()
        with pytest.raises(
            SandboxHostLostError, match=r"sandbox host b \(http://127\.0\.0\.1:\d+\) was lost"
        ) as caught:
            await lost.exec("echo hi")
        error = classify(caught.value, "agent")
        assert error.kind == "infra" and error.retryable and error.error_code == "sandbox_host_lost"
        assert not fleet.metrics()["b"]["healthy"]
        more = [await fleet.create(SPEC) for _ in range(2)]
        made += more
        assert [_host_of(s) for s in more] == ["a", "a"]  # past its capacity, and b is out of placement
        assert fleet.metrics()["b"]["failures"] >= 1 and fleet.metrics()["b"]["down_events"] == 1
        await lost.close()  # its host is gone: nothing to wait for
        b.start()  # the same port, the same state directory (the restart reaps what the crash left)
        for _ in range(50):
            if fleet.metrics()["b"]["healthy"]:
                break
            await asyncio.sleep(0.1)
        assert fleet.metrics()["b"]["healthy"], "the health check puts a recovered host back"
        back = await fleet.create(SPEC)
        assert _host_of(back) == "b"
        assert (await back.exec("echo back")).stdout == "back\n"
        await back.close()
        await asyncio.gather(*(s.close() for s in made))
    assert a.live() == 0 and b.live() == 0


async def test_every_host_down_is_a_retryable_error_naming_them(both_up: dict[str, SandboxHost]) -> None:
    b = both_up["b"]
    dead = HostConfig("http://127.0.0.1:9", name="gone", capacity=4)
    async with FleetProvider([dead, b.config()], FAST) as fleet:
        sb = await fleet.create(SPEC)  # "gone" refuses the connection: the create fails over to b
        assert _host_of(sb) == "b" and not fleet.metrics()["gone"]["healthy"]
        await sb.close()
    async with FleetProvider([dead], FAST) as fleet:
        with pytest.raises(SandboxHostLostError, match=r"no sandbox host could take the sandbox.*gone") as caught:
            await fleet.create(SPEC)
        assert classify(caught.value, "sandbox_create").retryable


def test_capacity_comes_from_a_contention_result_or_a_number(tmp_path: Path) -> None:
    result = tmp_path / "host.json"
    result.write_text(json.dumps(synthetic_result(2, capacity=3, slow=1.0)))
    assert slots_from_file(result) == 4  # 3 background tasks + the probe
    host = HostConfig("http://h:8700", capacity_file=str(result)).resolved()
    assert (host.name, host.capacity) == ("h:8700", 4.0)
    assert HostConfig("http://h:8700", capacity=2).resolved().capacity == 2
    with pytest.raises(ConfigError, match="capacity or capacity_file, not both"):
        HostConfig("http://h:8700", capacity=2, capacity_file=str(result))
    with pytest.raises(ConfigError, match="http"):
        HostConfig("h:8700")
    with pytest.raises(ConfigError, match="names must differ"):
        FleetProvider([HostConfig("http://h:1", name="x"), HostConfig("http://g:1", name="x")])


async def test_slowdown_is_against_the_fastest_run_of_the_same_command(both_up: dict[str, SandboxHost]) -> None:
    async with FleetProvider([both_up["a"].config()], FAST) as fleet:
        async with await fleet.create(SPEC) as sb:
            for _ in range(3):
                await sb.exec("sleep 0.05")
        record = fleet.metrics()["a"]
        assert record["commands"] == 3 and len(record["slowdowns"]) == 3
        assert 1.0 <= record["slowdown_p95"] < 3.0
