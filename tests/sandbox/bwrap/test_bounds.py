"""Issue #18: what a sandbox's contents can do to the harness that reads them and to its agent.

Reads are bounded whatever the file is (a link to /dev/zero, a sparse 100 GB file, a FIFO); no
wait on the agent is unbounded; a request too large for one frame is refused before it is sent;
a sandbox that ends on its own says whether its own processes caused it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from sandrl.errors import (
    SandboxClosedError,
    SandboxCrashedError,
    SandboxFileError,
    SandboxFileTooLargeError,
    SandboxRequestTooLargeError,
)
from sandrl.sandbox.base import MAX_READ_BYTES, SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider, BwrapSandbox
from sandrl.sandbox.bwrap.process import STREAM_HIGH_WATER
from sandrl.sandbox.bwrap.protocol import MAX_FRAME

from ...support import agent_host_pid, needs_sandbox

pytestmark = needs_sandbox


@pytest.fixture(scope="module")
def provider(either_launch: BwrapProvider) -> BwrapProvider:
    """Each bound and each crash verdict on a sandbox that bubblewrap set up and on one that the
    helper did (a fork's child, whose monitor is the helper)."""
    return either_launch


# -- 7: unbounded read_file


async def test_a_link_to_dev_zero_is_never_read_past_the_default_bound(sandbox: BwrapSandbox) -> None:
    await sandbox.exec("ln -s /dev/zero /workspace/answer.txt")
    total = 0
    with pytest.raises(SandboxFileError):  # too large (this bound), or refused as a device (the agent)
        async for chunk in sandbox.read_file_stream("/workspace/answer.txt"):
            total += len(chunk)
            if total > MAX_READ_BYTES:
                pytest.fail(f"read {total} bytes of /dev/zero, past the default bound of {MAX_READ_BYTES}")
    with pytest.raises(SandboxFileError):
        await asyncio.wait_for(sandbox.read_file("/workspace/answer.txt", max_bytes=64 << 10), 10)
    assert (await sandbox.exec("echo alive")).stdout == "alive\n"


async def test_a_sparse_100g_file_is_refused_at_the_callers_bound(sandbox: BwrapSandbox) -> None:
    assert (await sandbox.exec("truncate -s 100G /workspace/big")).ok
    with pytest.raises(SandboxFileTooLargeError) as info:
        await asyncio.wait_for(sandbox.read_file("/workspace/big", max_bytes=1 << 20), 10)
    message = str(info.value)
    assert "/workspace/big" in message and "larger than 1048576 bytes" in message
    assert "read_file_stream" in message and "max_bytes" in message  # what to do instead
    assert info.value.error_code == "file_too_large"
    with pytest.raises(SandboxFileTooLargeError):  # the default bound too: 64 MiB read, then refused
        await asyncio.wait_for(sandbox.read_file("/workspace/big"), 10)


async def test_a_file_of_exactly_the_bound_is_read_whole(sandbox: BwrapSandbox) -> None:
    data = os.urandom(3 << 20) + b"tail"  # across windows of the agent and chunks of its frames
    await sandbox.write_file("/workspace/exact", data)
    assert await sandbox.read_file("/workspace/exact", max_bytes=len(data)) == data
    with pytest.raises(SandboxFileTooLargeError):
        await sandbox.read_file("/workspace/exact", max_bytes=len(data) - 1)
    await sandbox.write_file("/workspace/empty", b"")
    assert await sandbox.read_file("/workspace/empty", max_bytes=0) == b""


# -- 8: a FIFO must not block pid 1, and no wait on the agent is unbounded


async def test_reading_a_fifo_fails_promptly_and_the_sandbox_keeps_working(sandbox: BwrapSandbox) -> None:
    assert (await sandbox.exec("mkfifo /workspace/fifo")).ok
    with pytest.raises(SandboxFileError):
        await asyncio.wait_for(sandbox.read_file("/workspace/fifo"), 5)
    result = await asyncio.wait_for(sandbox.exec("echo ok", timeout_s=1), 5)
    assert result.stdout == "ok\n"


@pytest.mark.parametrize("operation", ["exec", "read_file", "write_file"])
async def test_an_agent_that_stops_answering_is_given_up_on_in_bounded_time(
    provider: BwrapProvider, operation: str
) -> None:
    sandbox = await provider.create(SandboxSpec(ttl_s=120))
    sandbox.reply_timeout_s = 1.0
    agent = agent_host_pid(sandbox)
    requests: dict[str, Callable[[], Awaitable[object]]] = {
        "exec": lambda: sandbox.exec("echo ok", timeout_s=1),
        "read_file": lambda: sandbox.read_file("/etc/hostname"),
        "write_file": lambda: sandbox.write_file("/workspace/f", b"x" * (8 << 20)),  # more than the socket holds
    }
    os.kill(agent, signal.SIGSTOP)  # stuck as if blocked in a syscall, from the host: not the sandbox's doing
    try:
        started = time.monotonic()
        with pytest.raises(SandboxCrashedError) as info:
            await asyncio.wait_for(requests[operation](), 10)
        assert time.monotonic() - started < 5
        assert not info.value.caused_by_sandbox
        assert "did not answer" in str(info.value)
        assert sandbox.closed
        with pytest.raises(SandboxClosedError):
            await sandbox.exec("echo again")
    finally:
        await sandbox.close()
        if os.path.exists(f"/proc/{agent}"):
            os.kill(agent, signal.SIGCONT)


# -- 10: a request larger than one frame


async def test_a_request_over_the_frame_limit_is_refused_and_the_sandbox_lives(sandbox: BwrapSandbox) -> None:
    huge = "a" * (17 << 20)
    with pytest.raises(SandboxRequestTooLargeError) as info:
        await sandbox.exec(f"echo {huge}")
    message = str(info.value)
    assert f"{MAX_FRAME} bytes" in message and "stdin" in message and "write_file" in message
    with pytest.raises(SandboxRequestTooLargeError):
        await sandbox.exec("true", env={"BIG": huge})
    with pytest.raises(SandboxRequestTooLargeError):
        await sandbox.read_file("/" + huge)
    with pytest.raises(SandboxRequestTooLargeError):
        await sandbox.write_file("/" + huge, b"")
    result = await sandbox.exec("echo ok", timeout_s=5)
    assert result.stdout == "ok\n"
    # What the error tells the caller to do instead works.
    result = await sandbox.exec("wc -c", stdin=huge.encode(), timeout_s=30)
    assert result.stdout.strip() == str(len(huge))


# -- 9b: a sandbox that ends on its own


async def test_an_agent_killed_by_its_sandboxs_memory_use_is_the_sandboxs_crash(provider: BwrapProvider) -> None:
    async with await provider.create(SandboxSpec(memory_mb=32, ttl_s=120)) as sandbox:
        # The writable layer lives in memory: fill it to the limit (dd is OOM-killed), so that pid 1
        # has no memory left for its next request.
        await sandbox.exec("dd if=/dev/zero of=/workspace/fill bs=1M count=200", timeout_s=30)
        assert sandbox.stats().oom_kills >= 1
        try:
            for _ in range(5):
                await sandbox.read_file("/workspace/fill")
                await sandbox.exec("head -c 20000000 /dev/zero", timeout_s=10)
        except SandboxCrashedError as crash:
            error: SandboxCrashedError = crash
        else:
            # The agent survived its sandbox's memory use (it is protected from the OOM killer): end it
            # from the host as the OOM killer would, so the diagnosis still runs on the real evidence.
            os.kill(agent_host_pid(sandbox), signal.SIGKILL)
            with pytest.raises(SandboxCrashedError) as info:
                await sandbox.exec("echo again")
            error = info.value
        assert error.caused_by_sandbox, error.message
        assert error.error_code == "sandbox_crashed"
        assert "OOM-killed" in error.message and "32 MiB limit" in error.message
        assert sandbox.crash is error
        with pytest.raises(SandboxCrashedError):  # every later call says the same
            await sandbox.exec("echo again")


async def test_an_agent_killed_from_the_host_is_not_the_sandboxs_crash(provider: BwrapProvider) -> None:
    async with await provider.create(SandboxSpec(ttl_s=120)) as sandbox:
        os.kill(agent_host_pid(sandbox), signal.SIGKILL)
        with pytest.raises(SandboxClosedError) as info:
            await asyncio.wait_for(sandbox.exec("echo ok"), 10)
        error = info.value
        assert isinstance(error, SandboxCrashedError)
        assert not error.caused_by_sandbox
        assert error.error_code == "sandbox_closed"  # a client of the service sees a closed, retryable sandbox
        assert "status 137" in error.message and "OOM-killed 0 process(es)" in error.message


async def test_a_sandbox_closed_by_its_caller_is_not_a_crash(provider: BwrapProvider) -> None:
    sandbox = await provider.create(SandboxSpec(ttl_s=120))
    running = asyncio.create_task(sandbox.exec("sleep 30", timeout_s=60))
    await asyncio.sleep(0.3)
    await sandbox.close()
    with pytest.raises(SandboxClosedError) as info:
        await running
    assert not isinstance(info.value, SandboxCrashedError)
    assert sandbox.crash is None


async def test_writes_to_a_fifo_or_device_are_refused(sandbox: BwrapSandbox) -> None:
    """Pid 1 opens what it writes without blocking and writes regular files only."""
    await sandbox.exec("mkfifo /workspace/pipe; ln -s /dev/null /workspace/null")
    for path in ("/workspace/pipe", "/workspace/null", "/proc/1/oom_score_adj"):
        with pytest.raises(SandboxFileError):
            await asyncio.wait_for(sandbox.write_file(path, b"1000\n"), 10)
    assert (await sandbox.exec("cat /proc/1/oom_score_adj")).stdout == "0\n"


async def test_a_write_cut_by_a_full_disk_stops_at_once_and_leaves_no_file(provider: BwrapProvider) -> None:
    sent = 0

    async def chunks() -> AsyncIterator[bytes]:
        nonlocal sent
        for _ in range(256):
            sent += 1 << 20
            yield b"x" * (1 << 20)

    async with await provider.create(SandboxSpec(ttl_s=60, disk_mb=16)) as sb:
        with pytest.raises(SandboxFileError, match="No space left"):
            await sb.write_file_stream("/workspace/big", chunks())
        assert sent <= 24 << 20  # the first failing write is answered while the rest is unsent
        assert (await sb.exec("test -e /workspace/big || echo gone")).stdout == "gone\n"


async def test_uploads_whose_stream_fails_free_their_slot(sandbox: BwrapSandbox) -> None:
    """A client gone mid-upload must not keep one of the agent's 256 open-file slots for good."""

    async def broken() -> AsyncIterator[bytes]:
        yield b"partial"
        raise ConnectionResetError("the client went away")

    for i in range(300):
        with pytest.raises(ConnectionResetError):
            await sandbox.write_file_stream(f"/workspace/cut-{i}", broken())
    await sandbox.write_file("/workspace/after", b"ok")
    assert await sandbox.read_file("/workspace/after") == b"ok"


async def test_a_streaming_reader_that_stops_holds_the_command_back(sandbox: BwrapSandbox) -> None:
    """Issue #18 (6): output waiting for a reader stays bounded; the command waits, and loses nothing."""
    size = 200_000_000
    proc = await sandbox.spawn(f"head -c {size} /dev/zero", timeout_s=120, output_cap=1 << 30)
    chunks = proc.output()
    got = len((await anext(chunks)).data)
    await asyncio.sleep(2)  # ~GBs/s of /dev/zero would all be held by now without back-pressure
    assert proc._held <= STREAM_HIGH_WATER + (8 << 20)
    async for chunk in chunks:
        got += len(chunk.data)
    result = await proc.wait()
    assert (result.exit_code, got, result.truncated) == (0, size, False)
