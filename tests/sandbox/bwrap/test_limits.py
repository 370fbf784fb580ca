"""Limits, each enforced for real."""

from __future__ import annotations

import asyncio
import subprocess
import time

import pytest

from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider, BwrapSandbox

from ...support import needs_sandbox

pytestmark = needs_sandbox


@pytest.fixture(scope="module")
def provider(either_launch: BwrapProvider) -> BwrapProvider:
    """Each limit on a sandbox that bubblewrap set up and on one that the helper did (a fork's child)."""
    return either_launch


async def test_memory_hog_is_oom_killed_inside(provider: BwrapProvider) -> None:
    async with await provider.create(SandboxSpec(memory_mb=64)) as sb:
        r = await sb.exec("python3 -c \"b = bytearray(256 << 20); print('allocated')\"")
        assert "allocated" not in r.stdout
        assert r.exit_code in (137, -9)
        assert sb.stats().oom_kills >= 1
        assert (await sb.exec("echo alive")).stdout == "alive\n"  # only the hog died


async def test_fork_bomb_is_contained_and_host_stays_responsive(provider: BwrapProvider) -> None:
    async with await provider.create(SandboxSpec(pids=64, cpus=0.5)) as sb:
        # The root shell starts its sleep and one subshell for the bomb, then only waits (a builtin):
        # with no fork left it must still live until the timeout, which then kills the whole tree
        # under it. (Calling the bomb in the root shell would have it fork the pipeline's second
        # element itself, racing the first one's children for the last pids on a loaded host.)
        command = "sleep 30 & s=$!; bomb() { bomb | bomb & }; (bomb) & wait $s"
        bomb = asyncio.create_task(sb.exec(command, timeout_s=4))
        await asyncio.sleep(1.5)
        assert sb.stats().pids <= 64
        t = time.perf_counter()
        subprocess.run(["/bin/true"], check=True)
        assert time.perf_counter() - t < 2.0  # the host still forks promptly
        r = await bomb
        assert r.timed_out and r.exit_code == 124
        after = await sb.exec("ps -e --no-headers | wc -l")
        assert int(after.stdout) < 8  # the whole tree was killed at the timeout


async def test_dev_shm_fill_is_bounded_by_memory(provider: BwrapProvider) -> None:
    """/dev/shm's pages count against the sandbox's memory (on bubblewrap's /dev tmpfs, which has no
    size of its own, or the sandbox's disk tmpfs, larger here), so filling it stops near memory_mb and
    the sandbox goes on serving."""
    async with await provider.create(SandboxSpec(memory_mb=64)) as sb:
        await sb.exec("dd if=/dev/zero of=/dev/shm/fill bs=1M count=256", timeout_s=30)
        held = int((await sb.exec("du -sm /dev/shm | cut -f1")).stdout)
        assert held <= 64
        assert sb.stats().oom_kills >= 1
        assert (await sb.exec("rm /dev/shm/fill && echo alive")).stdout == "alive\n"


async def test_dev_shm_counts_against_the_disk(provider: BwrapProvider) -> None:
    """/dev is a directory of the sandbox's disk tmpfs, not a tmpfs of its own (each filesystem
    instance costs every memory cgroup of the host: bench/density.py): what /dev/shm holds counts
    against ``disk_mb`` with the sandbox's files, as well as against its memory."""
    async with await provider.create(SandboxSpec(disk_mb=16)) as sb:  # memory: 2 GiB
        r = await sb.exec("dd if=/dev/zero of=/dev/shm/fill bs=1M count=64")
        assert r.exit_code != 0
        assert "No space left on device" in r.stderr
        assert (await sb.exec("rm /dev/shm/fill && echo freed")).stdout == "freed\n"


async def test_disk_fill_hits_enospc(provider: BwrapProvider) -> None:
    async with await provider.create(SandboxSpec(disk_mb=16)) as sb:
        r = await sb.exec("dd if=/dev/zero of=/workspace/fill bs=1M count=64")
        assert r.exit_code != 0
        assert "No space left on device" in r.stderr
        assert (await sb.exec("rm /workspace/fill && echo freed")).stdout == "freed\n"


async def test_output_flood_is_capped(sandbox: BwrapSandbox) -> None:
    r = await sandbox.exec("head -c 5000000 /dev/zero | tr '\\0' a; echo done >&2")
    assert r.truncated
    assert len(r.stdout) == 1 << 20
    assert r.stderr == "done\n"
    assert r.exit_code == 0
    small = await sandbox.exec("seq 1 100000", output_cap=100)
    assert small.truncated and len(small.stdout) == 100


async def test_timeout_kills_runaway_and_background_children(sandbox: BwrapSandbox) -> None:
    t = time.perf_counter()
    r = await sandbox.exec("sleep 101 & setsid sleep 102 & (sleep 103 &) ; sleep 104", timeout_s=1)
    assert r.exit_code == 124
    assert r.timed_out
    assert time.perf_counter() - t < 5
    ps = await sandbox.exec("ps -eo args --no-headers")
    assert "sleep 10" not in ps.stdout


async def test_background_process_survives_a_normal_exit(sandbox: BwrapSandbox) -> None:
    r = await sandbox.exec("nohup sleep 300 >/dev/null 2>&1 & echo started")
    assert r.stdout == "started\n"
    await asyncio.sleep(0.5)  # let nohup exec sleep
    assert "sleep 300" in (await sandbox.exec("ps -eo args --no-headers")).stdout


async def test_background_writer_does_not_hold_the_exec(sandbox: BwrapSandbox) -> None:
    # The background job keeps stdout open; the exec must return when the shell exits.
    t = time.perf_counter()
    r = await sandbox.exec("(while true; do echo tick; sleep 0.1; done) & echo first", timeout_s=10)
    assert time.perf_counter() - t < 3
    assert r.stdout.startswith("first") or "first" in r.stdout
    assert "sleep" in (await sandbox.exec("ps -eo args --no-headers")).stdout


async def test_cpu_quota_is_enforced(provider: BwrapProvider) -> None:
    async with await provider.create(SandboxSpec(cpus=0.2)) as sb:
        before = sb.stats().cpu_s
        t = time.perf_counter()
        await sb.exec("timeout 2 sh -c 'while :; do :; done'", timeout_s=10)
        wall = time.perf_counter() - t
        used = sb.stats().cpu_s - before
        assert 0.1 * wall < used < 0.32 * wall, (used, wall)


async def test_ttl_ends_the_sandbox(provider: BwrapProvider) -> None:
    sb = await provider.create(SandboxSpec(ttl_s=1))
    assert (await sb.exec("echo up")).stdout == "up\n"
    await asyncio.sleep(1.6)
    assert sb.closed
    assert "TTL" in sb.close_reason
    for _ in range(100):
        if not provider.state.record_dir(sb.id).exists():
            break
        await asyncio.sleep(0.02)
    assert not provider.state.record_dir(sb.id).exists()


async def test_ttl_ended_by_the_agent_first_reads_as_the_ttl(provider: BwrapProvider) -> None:
    """Pid 1 ends itself at the TTL too, a moment before the provider's timer (it started first); on a
    busy host the timer fires late. Either way the sandbox closed because of its TTL, not a crash."""
    sb = await provider.create(SandboxSpec(ttl_s=1))
    sb._ttl_timer.cancel()  # the provider's timer as late as it can be: the agent's end comes first
    await asyncio.sleep(1.8)
    assert sb.closed
    assert "TTL" in sb.close_reason
    assert sb.crash is None


async def test_ttl_can_be_extended(provider: BwrapProvider) -> None:
    async with await provider.create(SandboxSpec(ttl_s=1)) as sb:
        await sb.set_ttl(30)
        await asyncio.sleep(1.5)
        assert (await sb.exec("echo still")).stdout == "still\n"
