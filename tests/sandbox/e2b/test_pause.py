"""Pause and resume through the official e2b SDK (sync and async) against a real sandrl server."""

from __future__ import annotations

import time

from e2b import AsyncSandbox, Sandbox

from .conftest import E2BServer


def test_pause_then_connect_resumes_with_processes_and_ttl(e2b_server: E2BServer) -> None:
    sb = Sandbox.create(timeout=8)
    try:
        sb.commands.run(
            "nohup sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/m; mv /tmp/m /tmp/n; done' >/dev/null 2>&1 &"
        )
        time.sleep(0.3)
        sb.pause()
        assert sb.get_info().state == "paused"
        entry = e2b_server.service.get(sb.sandbox_id)
        cpu = entry.sandbox.stats().cpu_s  # type: ignore[attr-defined]
        time.sleep(9)  # past its timeout: a paused sandbox's clock does not run
        assert entry.sandbox.stats().cpu_s - cpu < 0.05  # type: ignore[attr-defined]
        assert Sandbox.pause(sb.sandbox_id) is False  # paused already: E2B's 409
        again = Sandbox.connect(sb.sandbox_id)
        assert again.get_info().state == "running"
        first = int(again.commands.run("cat /tmp/n").stdout)
        time.sleep(0.3)
        assert int(again.commands.run("cat /tmp/n").stdout) > first > 0
    finally:
        Sandbox.kill(sb.sandbox_id)


async def test_async_pause_and_resume(e2b_server: E2BServer) -> None:
    sb = await AsyncSandbox.create(timeout=60)
    try:
        await sb.files.write("/tmp/kept", "yes")
        await sb.pause()
        resumed = await AsyncSandbox.connect(sb.sandbox_id)
        assert await resumed.files.read("/tmp/kept") == "yes"
        assert (await resumed.commands.run("echo back")).stdout == "back\n"
    finally:
        await AsyncSandbox.kill(sb.sandbox_id)
