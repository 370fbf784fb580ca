"""The server as its own process: kill -9 mid-exec then restart (nothing orphaned), and SIGTERM draining."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from sandrl.errors import SandboxUnavailableError
from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap.cgroups import CgroupManager
from sandrl.sandbox.bwrap.state import StateDir
from sandrl.sandbox.remote.config import ClientConfig
from sandrl.sandbox.remote.provider import RemoteProvider

from ...support import host_mounts, needs_sandbox, sandbox_mounts_added
from .conftest import TOKEN

pytestmark = needs_sandbox


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def server_process(state_dir: Path, port: int, grace_s: float = 10) -> Iterator[subprocess.Popen[bytes]]:
    code = (
        "from sandrl.sandbox.service.server import serve; from sandrl.sandbox.service.state import ServiceConfig; "
        f"serve('127.0.0.1', {port}, state_dir={str(state_dir)!r}, config=ServiceConfig(drain_grace_s={grace_s}), "
        "log_level='warning')"
    )
    env = {**os.environ, "SANDRL_TOKEN": TOKEN}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, (proc.stderr.read() if proc.stderr else b"").decode()
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stderr:
            proc.stderr.close()


def _uids(state: StateDir) -> dict[str, int]:
    out = {}
    for sid in state.records():
        meta = state.read_record(sid)
        if meta and isinstance(meta.get("uid"), int):
            out[sid] = int(meta["uid"])  # type: ignore[call-overload]
    return out


async def test_kill_9_mid_exec_then_restart_leaves_nothing(tmp_path: Path) -> None:
    state_dir, port = tmp_path / "state", _free_port()
    url = f"http://127.0.0.1:{port}"
    mounts_before = host_mounts()
    config = ClientConfig(retries=2, backoff_s=0.05)
    async with RemoteProvider(url, token=TOKEN, config=config) as remote:
        with server_process(state_dir, port) as proc:
            sbs = [await remote.create(SandboxSpec(ttl_s=600)) for _ in range(2)]
            for sb in sbs:
                await sb.exec("nohup sleep 1000 >/dev/null 2>&1 &")
            running = asyncio.create_task(sbs[0].exec("sleep 100", timeout_s=200))
            await asyncio.sleep(0.5)
            state = StateDir(state_dir)
            uids = _uids(state)
            assert set(uids) == {sb.id for sb in sbs}
            proc.send_signal(signal.SIGKILL)
            with pytest.raises(SandboxUnavailableError) as err:
                await running
            assert err.value.error_code == "service_connection_lost"
        with pytest.raises(SandboxUnavailableError) as err:
            await remote.create(SandboxSpec())
        assert err.value.error_code == "service_unreachable"
        # Without the server the sandboxes' supervisors see their socket close and kill everything inside.
        deadline = time.monotonic() + 10
        while state.sandbox_processes(set(uids.values())) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert state.sandbox_processes(set(uids.values())) == []
        cgroups = CgroupManager(subdir=f"sandrl/{state.cgroup_name}")
        with server_process(state_dir, port) as proc:  # the restarted server reaps what the crash left
            assert not set(uids) & set(cgroups.stale_groups())
            assert state.records() == []
            metrics = (await remote.request("GET", "/metrics", prefix="")).text
            assert "sandrl_sandboxes_reaped_total 2.0" in metrics
            async with await remote.create(SandboxSpec()) as sb:  # and serves again
                assert (await sb.exec("echo back")).stdout == "back\n"
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once drained
    assert sandbox_mounts_added(mounts_before, state_dir) == []


async def test_sigterm_drains_running_execs_then_closes_everything(tmp_path: Path) -> None:
    state_dir, port = tmp_path / "state", _free_port()
    async with RemoteProvider(f"http://127.0.0.1:{port}", token=TOKEN, config=ClientConfig(retries=0)) as remote:
        with server_process(state_dir, port, grace_s=15) as proc:
            idle = await remote.create(SandboxSpec(ttl_s=600))
            busy = await remote.create(SandboxSpec(ttl_s=600))
            await idle.exec("nohup sleep 1000 >/dev/null 2>&1 &")
            uids = _uids(StateDir(state_dir))
            running = asyncio.create_task(busy.exec("sleep 1.5; echo finished", timeout_s=30))
            await asyncio.sleep(0.4)
            proc.send_signal(signal.SIGTERM)
            result = await running
            assert result.stdout == "finished\n"
            with pytest.raises(SandboxUnavailableError):
                await remote.create(SandboxSpec())
            assert proc.wait(timeout=30) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once drained
        state = StateDir(state_dir)
        assert state.records() == []
        assert state.sandbox_processes(set(uids.values())) == []
        assert not set(uids) & set(CgroupManager(subdir=f"sandrl/{state.cgroup_name}").stale_groups())
        assert json.dumps(sorted(uids))  # two sandboxes were tracked
        assert len(uids) == 2
