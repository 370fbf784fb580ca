"""State between execs, files, and the exec interface."""

from __future__ import annotations

import asyncio

import pytest

from sandrl.errors import SandboxError, SandboxFileError
from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider, BwrapSandbox

from ...support import needs_sandbox

pytestmark = needs_sandbox


async def test_files_persist_between_execs(sandbox: BwrapSandbox) -> None:
    await sandbox.exec("mkdir -p /workspace/proj && echo 42 > /workspace/proj/answer")
    r = await sandbox.exec("cat answer", cwd="/workspace/proj")
    assert r.stdout == "42\n"


async def test_default_and_given_working_directory(sandbox: BwrapSandbox) -> None:
    assert (await sandbox.exec("pwd")).stdout == "/workspace\n"
    assert (await sandbox.exec("pwd", cwd="/tmp")).stdout == "/tmp\n"
    missing = await sandbox.exec("pwd", cwd="/nope")
    assert missing.exit_code == 1
    assert "/nope" in missing.stderr


async def test_environment_from_spec_and_call(provider: BwrapProvider) -> None:
    async with await provider.create(SandboxSpec(env={"ALPHA": "a", "BETA": "b"})) as sb:
        r = await sb.exec("echo $ALPHA $BETA $GAMMA $HOME", env={"BETA": "B", "GAMMA": "g"})
        assert r.stdout == "a B g /root\n"
        assert (await sb.exec("echo $ALPHA-$GAMMA")).stdout == "a-\n"


async def test_stdin_is_passed(sandbox: BwrapSandbox) -> None:
    data = bytes(range(256)) * 1000
    r = await sandbox.exec("sha256sum", stdin=data)
    import hashlib

    assert r.stdout.split()[0] == hashlib.sha256(data).hexdigest()


async def test_exit_codes_and_signals(sandbox: BwrapSandbox) -> None:
    assert (await sandbox.exec("exit 3")).exit_code == 3
    assert (await sandbox.exec("kill -9 $$")).exit_code == -9


async def test_concurrent_execs_in_one_sandbox(sandbox: BwrapSandbox) -> None:
    results = await asyncio.gather(*(sandbox.exec(f"sleep 0.2; echo {i}") for i in range(20)))
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(20)]


async def test_binary_file_round_trip(sandbox: BwrapSandbox) -> None:
    data = bytes(range(256)) * 4096 * 8  # 8 MiB, every byte value
    await sandbox.write_file("/workspace/sub/dir/blob.bin", data, mode=0o600)
    assert await sandbox.read_file("/workspace/sub/dir/blob.bin") == data
    r = await sandbox.exec("stat -c '%a %U %s' sub/dir/blob.bin")
    assert r.stdout == f"600 root {len(data)}\n"


async def test_empty_and_relative_files(sandbox: BwrapSandbox) -> None:
    await sandbox.write_file("empty", b"")
    assert await sandbox.read_file("/workspace/empty") == b""


async def test_file_errors_are_clear(sandbox: BwrapSandbox) -> None:
    with pytest.raises(SandboxFileError, match="No such file"):
        await sandbox.read_file("/does/not/exist")
    with pytest.raises(SandboxFileError, match="Is a directory"):
        await sandbox.read_file("/workspace")
    with pytest.raises(SandboxFileError):
        await sandbox.write_file("/proc/version", b"x")


async def test_streaming_process(sandbox: BwrapSandbox) -> None:
    proc = await sandbox.spawn("read line; echo got:$line; echo err >&2", stdin=True)
    await proc.write_stdin(b"hello\n")
    await proc.close_stdin()
    seen = [chunk async for chunk in proc.output()]
    assert b"".join(c.data for c in seen if c.stream == "stdout") == b"got:hello\n"
    result = await proc.wait()
    assert result.exit_code == 0
    assert result.stdout == ""  # already taken by output()


async def test_signal_kills_a_running_command(sandbox: BwrapSandbox) -> None:
    proc = await sandbox.spawn("sleep 60; echo never", timeout_s=120)
    await proc.kill()
    result = await proc.wait()
    assert result.exit_code == -9
    assert "never" not in result.stdout


async def test_nul_in_command_is_refused(sandbox: BwrapSandbox) -> None:
    with pytest.raises(SandboxError, match="NUL"):
        await sandbox.exec("echo \0")


async def test_network_true_does_not_share_the_hosts_loopback(provider: BwrapProvider) -> None:
    """It did once: a task sandbox reached every service on the host's 127.0.0.1 (what else it
    cannot reach is tested in namespaces of its own, ``test_network.py``)."""
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    try:
        async with await provider.create(SandboxSpec(network=True)) as sb:
            client = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=5); print('connected')"
            r = await sb.exec(f'python3 -c "{client}"')
            assert r.stdout == "" and "ConnectionRefusedError" in r.stderr, r
    finally:
        server.close()


async def test_stdin_to_a_command_that_does_not_read_never_stalls_the_sandbox(sandbox: BwrapSandbox) -> None:
    slow = asyncio.create_task(sandbox.exec("sleep 2; head -c 10 >/dev/null; echo read", stdin=b"x" * (4 << 20)))
    await asyncio.sleep(0.2)
    quick = await asyncio.wait_for(sandbox.exec("echo meanwhile"), 1.5)  # the agent is not blocked on the pipe
    assert quick.stdout == "meanwhile\n"
    assert (await slow).stdout == "read\n"
