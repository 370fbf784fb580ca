"""Commands given as an argv run without a shell in a bubblewrap sandbox (:mod:`sandrl.sandbox.command`)."""

from __future__ import annotations

import asyncio

import pytest

from sandrl.errors import InvalidCommandError
from sandrl.sandbox.bwrap import BwrapProvider, BwrapSandbox
from sandrl.sandbox.command import MAX_ARGS, MAX_ARGV_BYTES

from ...support import needs_sandbox

pytestmark = needs_sandbox


@pytest.fixture(scope="module")
def provider(either_launch: BwrapProvider) -> BwrapProvider:
    """Pid 1 runs the argv, whoever set the sandbox up: bubblewrap, or the helper (a fork's child)."""
    return either_launch


async def test_an_argv_reaches_the_program_unexpanded(sandbox: BwrapSandbox) -> None:
    listed = await sandbox.exec(["printf", "%s|", "$HOME", "a;b", "*", "", "two words", "$(id)"])
    assert listed.exit_code == 0, listed.stderr
    assert listed.stdout == "$HOME|a;b|*||two words|$(id)|"
    shell = await sandbox.exec("printf '%s|' \"$HOME\" a;echo b")
    assert shell.stdout == "/root|a|b\n"  # the string form is still a shell line
    # argv[0] is what the caller gave: sh -c's $0 is the caller's, not the "sh" of the string form.
    zero = await sandbox.exec(["/bin/sh", "-c", "echo $0"])
    assert zero.stdout == "/bin/sh\n"
    assert (await sandbox.exec("echo $0")).stdout == "sh\n"


async def test_an_argv_starts_no_shell(sandbox: BwrapSandbox) -> None:
    proc = await sandbox.spawn(["sleep", "30"])
    try:
        for _ in range(200):  # the start is answered once forked: the exec follows
            cmdline = await sandbox.exec(["cat", f"/proc/{proc.pid}/cmdline"])
            if "agent" not in cmdline.stdout:
                break
            await asyncio.sleep(0.01)
        assert cmdline.stdout == "sleep\x0030\x00"
        names = await sandbox.exec(["find", "/proc", "-mindepth", "2", "-maxdepth", "2", "-name", "comm", "-path",
                                    "/proc/[0-9]*/comm", "-exec", "cat", "{}", "+"])  # fmt: skip
        assert names.exit_code == 0, names.stderr
        comms = set(names.stdout.split())
        assert "sleep" in comms and not comms & {"sh", "dash", "bash"}, comms
    finally:
        await proc.signal(9)
        await proc.wait()


async def test_the_program_is_looked_up_in_the_commands_path(sandbox: BwrapSandbox) -> None:
    assert (await sandbox.exec(["true"])).exit_code == 0
    assert (await sandbox.exec(["/bin/true"])).exit_code == 0
    missing_path = await sandbox.exec(["true"], env={"PATH": "/nowhere:/also/nowhere"})
    assert missing_path.exit_code == 127
    assert "true" in missing_path.stderr and "No such file" in missing_path.stderr
    assert (await sandbox.exec(["/bin/true"], env={"PATH": "/nowhere"})).exit_code == 0
    await sandbox.write_file("/tmp/tool", b"#!/bin/sh\necho tool $1\n", mode=0o755)
    assert (await sandbox.exec(["./tool", "$1"], cwd="/tmp")).stdout == "tool $1\n"
    assert (await sandbox.exec(["tool", "x"], env={"PATH": "/nowhere::/usr/bin"}, cwd="/tmp")).stdout == "tool x\n"


async def test_a_program_that_is_not_there_or_cannot_run(sandbox: BwrapSandbox) -> None:
    missing = await sandbox.exec(["no-such-program-here", "arg"])
    assert missing.exit_code == 127
    assert missing.stderr == "sandrl: cannot run no-such-program-here: No such file or directory\n"
    assert (await sandbox.exec(["/no/such/program"])).exit_code == 127
    assert (await sandbox.exec("no-such-program-here")).exit_code == 127  # as the shell says
    await sandbox.write_file("/tmp/plain", b"echo hi\n", mode=0o644)
    denied = await sandbox.exec(["/tmp/plain"])
    assert denied.exit_code == 126 and "Permission denied" in denied.stderr
    await sandbox.write_file("/tmp/noshebang", b"echo hi\n", mode=0o755)
    no_format = await sandbox.exec(["/tmp/noshebang"])  # no shell runs it instead
    assert no_format.exit_code == 126 and "Exec format error" in no_format.stderr
    assert (await sandbox.exec(["/tmp"])).exit_code == 126


async def test_an_argv_has_the_same_limits_and_result(sandbox: BwrapSandbox) -> None:
    fed = await sandbox.exec(["cat"], stdin=b"fed")
    assert fed.stdout == "fed"
    assert (await sandbox.exec(("pwd",), cwd="/tmp")).stdout == "/tmp\n"
    assert (await sandbox.exec(["printenv", "X"], env={"X": "$Y;"})).stdout == "$Y;\n"
    slow = await sandbox.exec(["sleep", "30"], timeout_s=0.5)
    assert slow.exit_code == 124 and slow.timed_out
    flood = await sandbox.exec(["head", "-c", "3000000", "/dev/zero"])
    assert flood.truncated and len(flood.stdout) == 1 << 20
    assert (await sandbox.exec(["sh", "-c", "exit 3"])).exit_code == 3


@pytest.mark.parametrize(
    ("command", "says"),
    [
        ([], "cannot be empty"),
        ((), "cannot be empty"),
        ([""], "cannot be empty"),
        (["echo", "a\0b"], "argument 1 of an argv command contains a NUL byte"),
        (["echo", 3], "argument 1 of an argv command is int, not a string"),
        (["echo", b"x"], "is bytes, not a string"),
        (b"echo", "must be a string"),
        (None, "must be a string"),
        (iter(["echo"]), "must be a string"),
        ("echo a\0b", "cannot contain NUL bytes"),
        (["echo", "\udc80"], "not valid Unicode"),
        (["x"] * (MAX_ARGS + 1), f"over the limit of {MAX_ARGS}"),
        (["echo", "x" * MAX_ARGV_BYTES], f"over the limit of {MAX_ARGV_BYTES} bytes"),
    ],
)
async def test_bad_commands_are_refused(sandbox: BwrapSandbox, command: object, says: str) -> None:
    with pytest.raises(InvalidCommandError, match=says.replace("(", r"\(")):
        await sandbox.exec(command)  # type: ignore[arg-type]
    assert (await sandbox.exec(["true"])).exit_code == 0  # nothing was sent: the sandbox is fine


async def test_the_callers_list_may_change_once_exec_has_it(sandbox: BwrapSandbox) -> None:
    argv = ["sleep", "0.2"]
    run = asyncio.ensure_future(sandbox.exec(argv))
    await asyncio.sleep(0)
    argv[0] = "no-such-program"
    assert (await run).exit_code == 0
