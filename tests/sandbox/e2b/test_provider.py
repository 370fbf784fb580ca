"""E2BProvider: sandrl's rollouts on an E2B-compatible service, here sandrl's own, through the real SDK.

A full ``sandrl eval`` of built-in tasks (their templates built on the service's host first, as an
operator does), with the oracle and a scripted agent; a create burst under the concurrency limit;
the service killed mid-run and started again (every episode retried, none lost or counted twice).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandrl.errors import (
    CapacityExhaustedError,
    ImageNotFoundError,
    InvalidCommandError,
    SandboxClosedError,
    SandboxFileTooLargeError,
)
from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.e2b.provider import PROVIDER_LABEL, E2BConfig, E2BProvider
from sandrl.tasks.builtin import SUITE_DIR
from sandrl.tasks.builtin.generated import generate_tasks
from sandrl.wiring.evaluate import EvalConfig, evaluate

from ...entry_point import run_sandrl
from ...support import REASON
from .conftest import E2BServer
from .served import e2b_env, free_port, sandrl, start_service, stop

pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

BUILTIN = ("fix-lru-cache-eviction", "shell-top-error-ips", "c-fix-compile-errors")


@dataclass
class Host:
    port: int
    state_dir: Path
    tasks: Path


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    """A sandrl host serving E2B's API, with the templates of a few built-in tasks built on it."""
    root = tmp_path_factory.mktemp("e2b-host")
    tasks = root / "tasks"
    for name in BUILTIN:
        shutil.copytree(SUITE_DIR / name, tasks / name)
    state_dir = root / "state"
    built = sandrl("images", "templates", str(tasks), "--build", "--state-dir", str(state_dir), state_dir=state_dir)
    assert built.returncode == 0, built.stderr
    line = json.loads(built.stdout.splitlines()[-1])
    assert set(line["templates"]) == set(BUILTIN) and line["missing"] == []
    assert all(name.startswith("sandrl-") for name in line["templates"].values())
    port = free_port()
    proc = start_service(state_dir, port)
    try:
        with e2b_env(port):
            yield Host(port, state_dir, tasks)
    finally:
        stop(proc)


def test_eval_builtin_tasks_with_the_oracle_through_e2b(
    host: Host, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``sandrl eval`` by its entry point in this process (:func:`tests.entry_point.run_sandrl`)."""
    out = tmp_path / "rollouts.jsonl"
    args = [
        "eval",
        str(host.tasks),
        "--agent",
        "oracle",
        "--sandboxes",
        "e2b",
        "--out",
        str(out),
        "--results-dir",
        str(tmp_path / "eval"),
    ]
    r = run_sandrl(args, cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys, state_dir=host.state_dir)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout.splitlines()[-1])
    assert result["status"] == {"completed": 3, "truncated": 0, "agent_error": 0, "infra_error": 0}
    assert result["pass_rate"] == 1.0
    assert len(out.read_text().splitlines()) == 3


async def test_eval_with_a_scripted_agent_and_a_missing_template(host: Host, tmp_path: Path) -> None:
    replay = await evaluate(
        EvalConfig(str(host.tasks), agent="replay", think_s=(0.0, 0.1), sandboxes="e2b"), progress=False
    )
    assert replay.summary["status"]["completed"] == 3 and replay.summary["pass_rate"] == 1.0
    assert all(t.turns and t.attempt == 1 for t in replay.trajectories)

    lacking = tmp_path / "lacking"  # a task whose template nobody built on the service
    shutil.copytree(host.tasks / BUILTIN[0], lacking)
    (lacking / "environment" / "Dockerfile").write_text("FROM host\nWORKDIR /workspace\nRUN echo changed > /etc/x\n")
    missing = await evaluate(EvalConfig(str(lacking), agent="oracle", sandboxes="e2b"), progress=False)
    (episode,) = missing.trajectories
    assert episode.status == "infra_error" and episode.attempt == 1  # not worth a retry
    assert episode.error is not None and episode.error.error_code == ImageNotFoundError.error_code
    assert "sandrl images templates TASKS --build" in episode.error.message


async def test_sandbox_protocol_through_e2b(host: Host) -> None:
    async with E2BProvider() as provider:
        sb = await provider.create(SandboxSpec(ttl_s=120, workdir="/app", env={"A": "1"}))
        async with sb:
            result = await sb.exec("pwd; echo $A $B; exit 3", env={"B": "2"})
            assert (result.exit_code, result.stdout) == (3, "/app\n1 2\n")
            assert (await sb.exec("wc -c", stdin=b"x" * 700_000)).stdout == "700000\n"
            assert (await sb.exec("true", stdin=b"y" * 3_000_000)).exit_code == 0  # not read: no error
            slow = await sb.exec("echo started; sleep 30", timeout_s=1)
            assert (slow.exit_code, slow.timed_out, slow.stdout) == (124, True, "started\n")
            assert (await sb.exec("kill -TERM $$")).exit_code == -signal.SIGTERM
            assert (await sb.exec("head -c 3000000 /dev/zero")).truncated
            await sb.write_file("bin/run.sh", b"#!/bin/sh\necho ran\n", mode=0o755)
            assert (await sb.exec("./bin/run.sh", cwd="/app")).stdout == "ran\n"
            assert await sb.read_file("/app/bin/run.sh") == b"#!/bin/sh\necho ran\n"
            with pytest.raises(SandboxFileTooLargeError):
                await sb.read_file("bin/run.sh", max_bytes=5)
        await sb.close()  # idempotent
        with pytest.raises(SandboxClosedError):
            await sb.exec("true")


async def test_an_argv_is_quoted_for_envds_shell(host: Host) -> None:
    """envd runs every command through bash: an argv is quoted so bash expands none of it, and a program
    that is not there exits 127 as on the other backends."""
    async with E2BProvider() as provider, await provider.create(SandboxSpec(ttl_s=120)) as sb:
        listed = await sb.exec(["printf", "%s|", "$HOME", "a;b", "*", "it's", ""])
        assert (listed.exit_code, listed.stdout) == (0, "$HOME|a;b|*|it's||")
        assert (await sb.exec(["no-such-program-here"])).exit_code == 127
        with pytest.raises(InvalidCommandError):
            await sb.exec(["echo", "a\0b"])


async def test_create_burst_of_64_never_has_more_than_8_in_flight(
    e2b_server: E2BServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counted where the creates arrive: the service. The first creates are refused as over capacity,
    as a hosted service refuses a burst; they are retried with backoff and all succeed."""
    service = e2b_server.service
    original = service.create
    lock = threading.Lock()
    seen = {"now": 0, "max": 0, "calls": 0}

    async def counted(*args: Any, **kwargs: Any) -> Any:
        with lock:
            seen["now"] += 1
            seen["max"] = max(seen["max"], seen["now"])
            seen["calls"] += 1
            refuse = seen["calls"] <= 6
        try:
            if refuse:
                await asyncio.sleep(0.05)
                raise CapacityExhaustedError("the service is full (refused on purpose by the test)")
            return await original(*args, **kwargs)
        finally:
            with lock:
                seen["now"] -= 1

    monkeypatch.setattr(service, "create", counted)
    given = {"api_url": e2b_server.url, "sandbox_url": e2b_server.url, "api_key": e2b_server.token}
    async with E2BProvider(E2BConfig(create_concurrency=8, backoff_s=0.05, **given)) as provider:
        start = time.monotonic()
        sandboxes = await asyncio.gather(*(provider.create(SandboxSpec(ttl_s=120)) for _ in range(64)))
        took = time.monotonic() - start
        print(f"64 creates, 8 at once: {took:.2f} s ({64 / took:.1f}/s), {provider.create_retries_done} retried")
        assert len({sb.id for sb in sandboxes}) == 64
        assert seen["max"] <= 8 and provider.max_creates_in_flight == 8
        assert provider.create_retries_done >= 1
        results = await asyncio.gather(*(sb.exec("echo ok") for sb in sandboxes))
        assert all(r.stdout == "ok\n" for r in results)
    assert all(sb.closed for sb in sandboxes)  # the provider killed what it held
    assert service.list({PROVIDER_LABEL: provider.id}) == []


async def test_killed_service_mid_run_episodes_retried_none_lost_or_doubled(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    generate_tasks(tasks, "echo", 8, 0)  # FROM host: the template every E2B service has, base
    state_dir, port = tmp_path / "state", free_port()
    out = tmp_path / "rollouts.jsonl"
    proc = start_service(state_dir, port)
    restarted: list[float] = []

    async def kill_then_restart() -> None:
        nonlocal proc
        async with httpx.AsyncClient() as client:  # killed once every episode has its sandbox
            while (await client.get(f"http://127.0.0.1:{port}/healthz")).json()["live"] < 8:
                await asyncio.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        await asyncio.to_thread(proc.wait)
        proc = await asyncio.to_thread(start_service, state_dir, port)
        restarted.append(time.monotonic())

    try:
        with e2b_env(port):
            killer = asyncio.create_task(kill_then_restart())
            config = EvalConfig(
                str(tasks), agent="replay", think_s=(0.5, 0.8), sandboxes="e2b", concurrency=8, out=out, run_id="k"
            )
            result = await evaluate(config, progress=False)
            await killer
    finally:
        stop(proc)
    assert restarted, "the service was not restarted"
    summary = result.summary
    assert summary["episodes"] == 8 and summary["status"]["completed"] == 8 and summary["pass_rate"] == 1.0
    retried = [t for t in result.trajectories if t.attempt > 1]
    assert retried, "no episode was in flight when the service died"
    for t in retried:
        assert all(e.kind == "infra" and e.retryable for e in t.retried_errors), t.retried_errors
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    ids = [line["episode_id"] for line in lines]
    assert sorted(ids) == sorted({t.episode_id for t in result.trajectories}) and len(ids) == 8
