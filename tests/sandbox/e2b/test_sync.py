"""The official e2b SDK (sync ``Sandbox``) against a real sandrl server: commands, files, lifecycle."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from e2b import CommandExitException, FileType, NotFoundException, Sandbox, SandboxQuery, TimeoutException

from .conftest import E2BServer


@pytest.fixture
def sandbox(e2b_server: E2BServer) -> Iterator[Sandbox]:
    sb = Sandbox.create(timeout=120)
    yield sb
    sb.kill()


def test_run_echo(sandbox: Sandbox) -> None:
    result = sandbox.commands.run("echo hi; echo oops >&2")
    assert (result.stdout, result.stderr, result.exit_code) == ("hi\n", "oops\n", 0)


def test_failing_command_raises_with_its_exit_code(sandbox: Sandbox) -> None:
    with pytest.raises(CommandExitException) as caught:
        sandbox.commands.run("echo half; echo bad >&2; exit 3")
    assert caught.value.exit_code == 3
    assert caught.value.stdout == "half\n"
    assert caught.value.stderr == "bad\n"


def test_timeout_raises_and_kills_the_command(sandbox: Sandbox) -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutException):
        sandbox.commands.run("sleep 30", timeout=1)
    assert time.monotonic() - started < 10
    deadline = time.monotonic() + 5
    while sandbox.commands.list() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sandbox.commands.list() == []


def test_background_process_listed_then_killed(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("echo started; sleep 60", background=True)
    listed = sandbox.commands.list()
    assert [p.pid for p in listed] == [handle.pid]
    assert listed[0].cmd == "/bin/bash" and listed[0].args[-1] == "echo started; sleep 60"
    assert handle.kill() is True
    with pytest.raises(CommandExitException) as caught:
        handle.wait()
    assert caught.value.exit_code == -1
    assert sandbox.commands.list() == []
    assert sandbox.commands.kill(handle.pid) is False


def test_stdin_of_a_background_process(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("cat; echo done", background=True, stdin=True)
    handle.send_stdin("line one\n")
    sandbox.commands.send_stdin(handle.pid, b"line two\n")
    handle.close_stdin()
    assert handle.wait().stdout == "line one\nline two\ndone\n"


def test_reconnect_by_pid(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("sleep 0.5; echo late", background=True)
    handle.disconnect()
    again = sandbox.commands.connect(handle.pid)
    assert again.wait().stdout == "late\n"


def test_envs_and_cwd(e2b_server: E2BServer) -> None:
    sb = Sandbox.create(envs={"FROM_CREATE": "c"}, timeout=60)
    try:
        result = sb.commands.run("echo $FROM_CREATE $FROM_RUN; pwd", envs={"FROM_RUN": "r"}, cwd="/tmp")
        assert result.stdout == "c r\n/tmp\n"
        assert sb.commands.run("pwd").stdout == "/workspace\n"
    finally:
        sb.kill()


def test_files_text_and_binary(sandbox: Sandbox) -> None:
    info = sandbox.files.write("/workspace/notes/hello.txt", "héllo\n")
    assert (info.path, info.name) == ("/workspace/notes/hello.txt", "hello.txt")
    assert sandbox.files.read("/workspace/notes/hello.txt") == "héllo\n"
    data = bytes(range(256)) * 4096  # 1 MiB, every byte value
    sandbox.files.write("/tmp/blob.bin", data)
    assert bytes(sandbox.files.read("/tmp/blob.bin", format="bytes")) == data
    sandbox.files.write("/tmp/blob2.bin", data, use_octet_stream=True, gzip=True)
    assert bytes(sandbox.files.read("/tmp/blob2.bin", format="bytes")) == data
    assert (
        sandbox.commands.run("sha256sum /tmp/blob.bin /tmp/blob2.bin | awk '{print $1}' | uniq | wc -l").stdout == "1\n"
    )
    written = sandbox.files.write_files(
        [{"path": "many/a.txt", "data": "A"}, {"path": "/tmp/many/b.txt", "data": b"B"}]
    )
    assert [w.path for w in written] == ["/workspace/many/a.txt", "/tmp/many/b.txt"]
    assert sandbox.files.read("/workspace/many/a.txt") + sandbox.files.read("/tmp/many/b.txt") == "AB"


def test_files_list_exists_remove_rename_make_dir(sandbox: Sandbox) -> None:
    files = sandbox.files
    assert files.make_dir("/workspace/d/sub") is True
    assert files.make_dir("/workspace/d/sub") is False
    files.write("/workspace/d/x.txt", "12345")
    entries = {e.name: e for e in files.list("/workspace/d")}
    assert set(entries) == {"sub", "x.txt"}
    assert entries["sub"].type is FileType.DIR and entries["x.txt"].type is FileType.FILE
    assert entries["x.txt"].size == 5 and entries["x.txt"].path == "/workspace/d/x.txt"
    assert entries["x.txt"].permissions == "-rw-r--r--" and entries["x.txt"].owner == "root"
    assert {e.path for e in files.list("/workspace/d", depth=2)} >= {"/workspace/d/sub", "/workspace/d/x.txt"}
    assert files.exists("/workspace/d/x.txt") and not files.exists("/workspace/d/nope")
    moved = files.rename("/workspace/d/x.txt", "/workspace/d/sub/y.txt")
    assert moved.path == "/workspace/d/sub/y.txt" and files.get_info("/workspace/d/sub/y.txt").size == 5
    assert not files.exists("/workspace/d/x.txt")
    files.remove("/workspace/d")
    assert not files.exists("/workspace/d")
    with pytest.raises(NotFoundException):
        files.read("/workspace/d/sub/y.txt")
    with pytest.raises(NotFoundException):
        files.list("/workspace/d")


def test_list_with_metadata_and_get_info(e2b_server: E2BServer) -> None:
    run = f"run-{time.monotonic_ns()}"
    a = Sandbox.create(metadata={"run": run, "role": "a"}, timeout=60)
    b = Sandbox.create(metadata={"run": run, "role": "b"}, timeout=60)
    try:
        found = Sandbox.list(query=SandboxQuery(metadata={"run": run})).next_items()
        assert {s.sandbox_id for s in found} == {a.sandbox_id, b.sandbox_id}
        only_b = Sandbox.list(query=SandboxQuery(metadata={"run": run, "role": "b"})).next_items()
        assert [s.sandbox_id for s in only_b] == [b.sandbox_id]
        info = a.get_info()
        assert info.metadata == {"run": run, "role": "a"} and info.template_id == "base"
        assert a.is_running()
    finally:
        a.kill()
        b.kill()
    assert Sandbox.list(query=SandboxQuery(metadata={"run": run})).next_items() == []


def test_set_timeout_then_expiry(e2b_server: E2BServer) -> None:
    sb = Sandbox.create(timeout=120)
    before = sb.get_info().end_at
    sb.set_timeout(2)
    assert sb.get_info().end_at < before
    deadline = time.monotonic() + 15
    while sb.is_running() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not sb.is_running()
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sb.sandbox_id)


def test_kill(e2b_server: E2BServer) -> None:
    sb = Sandbox.create(timeout=60)
    assert Sandbox.kill(sb.sandbox_id) is True
    assert Sandbox.kill(sb.sandbox_id) is False
    assert not sb.is_running()


def test_connect_to_a_running_sandbox(sandbox: Sandbox) -> None:
    again = Sandbox.connect(sandbox.sandbox_id)
    again.files.write("/tmp/shared.txt", "seen")
    assert sandbox.files.read("/tmp/shared.txt") == "seen"
