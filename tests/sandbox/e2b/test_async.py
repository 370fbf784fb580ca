"""The official e2b SDK's ``AsyncSandbox`` against a real sandrl server, several sandboxes at once."""

from __future__ import annotations

import asyncio

import pytest
from e2b import AsyncSandbox, CommandExitException, SandboxQuery, TimeoutException

from .conftest import E2BServer


async def test_async_commands_and_files(e2b_server: E2BServer) -> None:
    sb = await AsyncSandbox.create(timeout=60, metadata={"suite": "async"})
    try:
        result = await sb.commands.run("echo hi")
        assert (result.stdout, result.exit_code) == ("hi\n", 0)
        with pytest.raises(CommandExitException) as caught:
            await sb.commands.run("exit 7")
        assert caught.value.exit_code == 7
        with pytest.raises(TimeoutException):
            await sb.commands.run("sleep 30", timeout=1)
        result = await sb.commands.run("echo $X; pwd", envs={"X": "y"}, cwd="/tmp")
        assert result.stdout == "y\n/tmp\n"
        data = bytes(range(256)) * 4096
        await sb.files.write("/tmp/blob.bin", data)
        assert bytes(await sb.files.read("/tmp/blob.bin", format="bytes")) == data
        await sb.files.write("rel.txt", "text")
        assert await sb.files.read("/workspace/rel.txt") == "text"
        assert await sb.files.exists("rel.txt")
        assert await sb.files.make_dir("/tmp/d") is True
        await sb.files.rename("/workspace/rel.txt", "/tmp/d/rel.txt")
        assert [e.name for e in await sb.files.list("/tmp/d")] == ["rel.txt"]
        await sb.files.remove("/tmp/d")
        assert not await sb.files.exists("/tmp/d")
        listed = await (AsyncSandbox.list(query=SandboxQuery(metadata={"suite": "async"}))).next_items()
        assert [s.sandbox_id for s in listed] == [sb.sandbox_id]
    finally:
        await sb.kill()
    assert not await sb.is_running()


async def test_async_background_and_kill(e2b_server: E2BServer) -> None:
    sb = await AsyncSandbox.create(timeout=60)
    try:
        seen: list[str] = []
        handle = await sb.commands.run("echo ready; sleep 60", background=True, on_stdout=seen.append)
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.05)
        assert seen == ["ready\n"]
        assert [p.pid for p in await sb.commands.list()] == [handle.pid]
        assert await handle.kill() is True
        with pytest.raises(CommandExitException) as caught:
            await handle.wait()
        assert caught.value.exit_code == -1
        assert await sb.commands.list() == []
    finally:
        await sb.kill()


async def test_many_sandboxes_concurrently(e2b_server: E2BServer) -> None:
    sandboxes = await asyncio.gather(*(AsyncSandbox.create(timeout=60) for _ in range(8)))
    try:
        results = await asyncio.gather(*(sb.commands.run(f"echo {i}") for i, sb in enumerate(sandboxes)))
        assert [r.stdout for r in results] == [f"{i}\n" for i in range(8)]
    finally:
        await asyncio.gather(*(sb.kill() for sb in sandboxes))


async def test_envd_runs_the_start_requests_argv_with_no_shell_in_front(
    e2b_server: E2BServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """envd's Start names ``cmd`` and ``args``: run as that argv (as E2B's envd runs it), not through
    ``/bin/sh``. The SDK always sends ``/bin/bash -l -c``; here it sends the program itself, as another
    envd client may: a file with no ``#!`` then cannot run (126), where a shell in front would have run it."""
    from e2b.envd.process import process_pb

    made = process_pb.ProcessConfig

    def argv_config(*, cmd: str, args: list[str], **kwargs: object) -> object:
        if cmd == "/bin/bash" and args[-1].startswith("ARGV "):
            cmd, *args = args[-1].split()[1:]
        return made(cmd=cmd, args=args, **kwargs)

    monkeypatch.setattr(process_pb, "ProcessConfig", argv_config)
    sb = await AsyncSandbox.create(timeout=60)
    try:
        await sb.files.write("/tmp/noshebang", "echo ran\n")
        await sb.commands.run("chmod +x /tmp/noshebang")
        with pytest.raises(CommandExitException) as raised:
            await sb.commands.run("ARGV /tmp/noshebang")
        assert raised.value.exit_code == 126 and "Exec format error" in raised.value.stderr
        printed = await sb.commands.run("ARGV printf %s| $HOME ;")
        assert printed.stdout == "$HOME|;|"
        assert (await sb.commands.run("echo $0")).stdout == "/bin/bash\n"  # the SDK's own form is unchanged
    finally:
        await sb.kill()
