"""Argv commands (run without a shell) through the sandbox service: the client, the stream, raw HTTP."""

from __future__ import annotations

import httpx
import pytest

from sandrl.errors import InvalidCommandError
from sandrl.sandbox.base import ExecResult, OutputChunk
from sandrl.sandbox.remote.provider import RemoteSandbox

from ...support import needs_sandbox

pytestmark = needs_sandbox


async def test_an_argv_runs_unexpanded_through_the_client(remote_sandbox: RemoteSandbox) -> None:
    listed = await remote_sandbox.exec(["printf", "%s|", "$HOME", "a;b", "*"], stdin=b"unused")
    assert listed.exit_code == 0 and listed.stdout == "$HOME|a;b|*|", listed
    assert (await remote_sandbox.exec(["/bin/sh", "-c", "echo $0"])).stdout == "/bin/sh\n"
    assert (await remote_sandbox.exec("printf '%s|' \"$HOME\"")).stdout == "/root|"
    missing = await remote_sandbox.exec(["no-such-program-here"])
    assert missing.exit_code == 127 and "cannot run no-such-program-here" in missing.stderr
    timed = await remote_sandbox.exec(["sleep", "30"], timeout_s=0.5)
    assert timed.exit_code == 124 and timed.timed_out


async def test_an_argv_streams(remote_sandbox: RemoteSandbox) -> None:
    seen: list[OutputChunk | ExecResult] = [c async for c in remote_sandbox.exec_stream(["printf", "%s", "$X;"])]
    assert b"".join(c.data for c in seen if isinstance(c, OutputChunk)) == b"$X;"
    assert isinstance(seen[-1], ExecResult) and seen[-1].exit_code == 0


@pytest.mark.parametrize("command", [[], ["echo", "a\0b"], ["echo", 1], [""], "echo \0"])
async def test_the_client_refuses_a_bad_command_without_sending_it(
    remote_sandbox: RemoteSandbox, command: object
) -> None:
    with pytest.raises(InvalidCommandError):
        await remote_sandbox.exec(command)  # type: ignore[arg-type]


async def test_raw_http_takes_an_argv_and_refuses_bad_ones(
    http: httpx.AsyncClient, remote_sandbox: RemoteSandbox
) -> None:
    url = f"/v1/sandboxes/{remote_sandbox.id}/exec"
    r = await http.post(url, json={"command": ["printf", "%s", "$HOME;"]})
    assert r.status_code == 200 and r.json()["stdout"] == "$HOME;", r.text
    r = await http.post(url, json={"command": ["no-such-program-here"]})
    assert r.status_code == 200 and r.json()["exit_code"] == 127
    for body, says in (
        ({"command": []}, ""),
        ({"command": ["echo", "a\u0000b"]}, "argument 1 of an argv command contains a NUL byte"),
        ({"command": [""]}, "cannot be empty"),
        ({"command": ["echo", 3]}, ""),
        ({"command": {"argv": ["echo"]}}, ""),
    ):
        r = await http.post(url, json=body)
        assert r.status_code == 400 and r.json()["error_code"] == "invalid_request", r.text
        assert says in r.json()["message"]
