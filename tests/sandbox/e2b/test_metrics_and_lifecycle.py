"""Metrics, sandbox info, snapshot listing and auto-pause through the official e2b SDK (sync and async)."""

from __future__ import annotations

import asyncio
import datetime
import time

from e2b import AsyncSandbox, Sandbox, SandboxQuery, SandboxState

from .conftest import E2BServer


def test_metrics_read_cpu_memory_and_disk_from_the_cgroup(e2b_server: E2BServer) -> None:
    sb = Sandbox.create(timeout=60)
    try:
        sb.commands.run("head -c 8000000 /dev/urandom > /workspace/blob")
        sb.commands.run("timeout 0.5 sh -c 'while :; do :; done'; true")
        (metric,) = sb.get_metrics()
        assert metric.cpu_count == 1 and 0 < metric.cpu_used_pct <= 100
        assert metric.mem_total == 2048 << 20 and metric.mem_used >= 8_000_000  # the writable layer is memory
        assert metric.disk_total == 4096 << 20 and 8_000_000 <= metric.disk_used < 9_000_000
        assert abs(metric.timestamp.timestamp() - time.time()) < 30
        # The CPU share is since the previous read: an idle while later it is near 0.
        time.sleep(0.5)
        (idle,) = Sandbox.get_metrics(sb.sandbox_id)
        assert idle.cpu_used_pct < 20
        # No history is kept: a window that ended an hour ago has nothing.
        an_hour_ago = datetime.datetime.now() - datetime.timedelta(hours=1)
        assert sb.get_metrics(end=an_hour_ago) == []
    finally:
        sb.kill()


def test_info_lists_and_snapshot_listing(e2b_server: E2BServer) -> None:
    a = Sandbox.create(timeout=60, metadata={"suite": "listing"})
    b = Sandbox.create(timeout=60)
    snapshots: list[str] = []
    try:
        info = a.get_info()
        assert info.lifecycle == {"on_timeout": "kill", "auto_resume": False}
        assert info.state == SandboxState.RUNNING and info.name == "base" and info.cpu_count == 1
        snapshots += [a.create_snapshot().snapshot_id, a.create_snapshot(name="listing-named").snapshot_id]
        snapshots.append(b.create_snapshot().snapshot_id)
        assert [s.snapshot_id for s in a.list_snapshots().next_items()] == snapshots[:2]
        mine = Sandbox.list_snapshots(sandbox_id=b.sandbox_id).next_items()
        assert [(s.snapshot_id, s.names) for s in mine] == [(snapshots[2], [snapshots[2]])]
        assert [s.snapshot_id for s in Sandbox.list_snapshots(name="team/listing-named:v1").next_items()] == [
            "listing-named"
        ]
        pages = a.list_snapshots(limit=1)
        first, second = pages.next_items(), pages.next_items()
        assert [s.snapshot_id for s in first + second] == snapshots[:2] and not pages.has_next
        # A paused sandbox is listed as paused, and found by the state filter.
        a.pause()
        paused = Sandbox.list(query=SandboxQuery(metadata={"suite": "listing"}, state=[SandboxState.PAUSED]))
        assert [(s.sandbox_id, s.state) for s in paused.next_items()] == [(a.sandbox_id, SandboxState.PAUSED)]
        running = Sandbox.list(query=SandboxQuery(metadata={"suite": "listing"}, state=[SandboxState.RUNNING]))
        assert running.next_items() == []
    finally:
        for sb in (a, b):
            sb.kill()
        for name in snapshots:
            Sandbox.delete_snapshot(name)
    assert Sandbox.list_snapshots(sandbox_id=a.sandbox_id).next_items() == []


def test_auto_pause_pauses_at_the_timeout_and_connect_resumes(e2b_server: E2BServer) -> None:
    sb = Sandbox.create(timeout=2, lifecycle={"on_timeout": "pause"})
    try:
        assert sb.get_info().lifecycle == {"on_timeout": "pause", "auto_resume": False}
        loop = "nohup sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/m; mv /tmp/m /tmp/n; done' >/dev/null 2>&1 &"
        sb.commands.run(loop)
        # A command running at the timeout is not frozen in the middle: the pause waits for its end.
        assert sb.commands.run("sleep 3; echo done").stdout == "done\n"
        deadline = time.monotonic() + 15
        while sb.get_info().state != SandboxState.PAUSED and time.monotonic() < deadline:
            time.sleep(0.2)
        assert sb.get_info().state == SandboxState.PAUSED
        entry = e2b_server.service.get(sb.sandbox_id)
        cpu = entry.sandbox.stats().cpu_s  # type: ignore[attr-defined]
        time.sleep(1.0)  # paused: no CPU, and its (spent) TTL does not run
        assert entry.sandbox.stats().cpu_s - cpu < 0.05  # type: ignore[attr-defined]
        again = Sandbox.connect(sb.sandbox_id, timeout=30)
        info = again.get_info()
        assert info.state == SandboxState.RUNNING
        assert 20 < (info.end_at.timestamp() - time.time()) <= 31  # the connect's timeout
        first = int(again.commands.run("cat /tmp/n").stdout)
        time.sleep(0.3)
        assert int(again.commands.run("cat /tmp/n").stdout) > first > 0  # the loop went on
    finally:
        Sandbox.kill(sb.sandbox_id)


async def test_async_metrics_snapshots_and_auto_pause(e2b_server: E2BServer) -> None:
    sb = await AsyncSandbox.create(timeout=2, lifecycle={"on_timeout": "pause"})
    name = ""
    try:
        (metric,) = await sb.get_metrics()
        assert metric.mem_total == 2048 << 20 and metric.disk_total > 0
        name = (await sb.create_snapshot()).snapshot_id
        listed = await (AsyncSandbox.list_snapshots(sandbox_id=sb.sandbox_id)).next_items()
        assert [s.snapshot_id for s in listed] == [name]
        deadline = time.monotonic() + 15
        while (await sb.get_info()).state != SandboxState.PAUSED and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        resumed = await AsyncSandbox.connect(sb.sandbox_id)
        info = await resumed.get_info()
        assert info.state == SandboxState.RUNNING and 5 < info.end_at.timestamp() - time.time() <= 16  # E2B's 15 s
        assert (await resumed.commands.run("echo back")).stdout == "back\n"
    finally:
        await AsyncSandbox.kill(sb.sandbox_id)
        if name:
            await AsyncSandbox.delete_snapshot(name)
