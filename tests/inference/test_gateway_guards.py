"""The runner's session gateway against a hostile caller on the same machine: no way to open sessions,
each session answers only to its own key, loopback names only, and bodies bounded before they are read.

The gateway of ``sandrl eval`` / ``sandrl train`` runs on the trainer's own event loop; before these
guards 4096 anonymous opens locked every harness episode out for an hour, and one 96 MiB body grew
the process by over 200 MiB.
"""

from __future__ import annotations

import asyncio
import json
import re
import select
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from sandrl.inference.gateway import Gateway, create_gateway_app
from sandrl.inference.server import BackgroundServer

from .test_gateway import ScriptedReplies

ROOT = Path(__file__).resolve().parents[2]
MiB = 2**20
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def runner_gateway() -> Iterator[tuple[Gateway, str]]:
    """The runner's gateway app on a loopback port, and the gateway itself (sessions are opened on it)."""
    gateway = Gateway(ScriptedReplies(["Done."]), model_name="scripted")  # type: ignore[arg-type]
    with BackgroundServer(create_gateway_app(gateway)) as server:
        yield gateway, server.url


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=30) as client:
        yield client


async def _pipelined(url: str, request: bytes, count: int, connections: int = 8) -> list[int]:
    """Send ``request`` ``count`` times over a few kept-alive connections, pipelined (a flood costs its
    sender little); the statuses of the answers."""
    target = httpx.URL(url)
    assert target.port is not None

    async def one(n: int) -> list[int]:
        reader, writer = await asyncio.open_connection("127.0.0.1", target.port)
        writer.write(request * n)
        await writer.drain()
        got, statuses = b"", []
        while len(statuses) < n:
            chunk = await asyncio.wait_for(reader.read(1 << 16), timeout=60)
            assert chunk, f"the server closed the connection after {len(statuses)} answers"
            got += chunk
            statuses = [int(code) for code in re.findall(rb"HTTP/1\.1 (\d{3}) ", got)]
        writer.close()
        return statuses

    shares = [count // connections + (i < count % connections) for i in range(connections)]
    return [status for part in await asyncio.gather(*(one(n) for n in shares)) for status in part]


async def test_a_flood_of_opens_does_not_lock_out_the_runners_sessions(
    runner_gateway: tuple[Gateway, str],
) -> None:
    gateway, url = runner_gateway
    port = httpx.URL(url).port
    open_request = f"POST /v1/sessions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\n\r\n".encode()
    statuses = await _pipelined(url, open_request, 4096)
    assert len(statuses) == 4096 and set(statuses) <= {401, 403, 404, 405}, set(statuses)
    assert gateway.sessions == {}
    session = gateway.open()  # the runner's next episode still gets its session
    assert session.id in gateway.sessions


async def test_a_session_answers_only_to_its_own_key(
    runner_gateway: tuple[Gateway, str], http: httpx.AsyncClient
) -> None:
    gateway, url = runner_gateway
    mine, other = gateway.open(), gateway.open()
    base = f"{url}/v1/sessions/{mine.id}"
    for headers in ({}, {"Authorization": "Bearer sandrl"}, {"Authorization": "Bearer " + "x" * 43}):
        for method, path in (("POST", "/chat/completions"), ("GET", "/models")):
            r = await http.request(method, base + path, json=CHAT, headers=headers)
            assert r.status_code == 401 and r.json()["error_code"] == "unauthorized", (headers, r.text)
    basic = await http.post(f"{base}/chat/completions", json=CHAT, headers={"Authorization": f"Basic {mine.key}"})
    assert basic.status_code == 401
    in_query = await http.post(f"{base}/chat/completions", params={"api_key": mine.key}, json=CHAT)
    assert in_query.status_code == 401 and "query string" in in_query.json()["message"]
    # Another session's key reads, writes and closes nothing of this one.
    foreign = {"Authorization": f"Bearer {other.key}"}
    assert (await http.post(f"{base}/chat/completions", json=CHAT, headers=foreign)).status_code == 401
    assert (await http.get(f"{base}/models", headers=foreign)).status_code == 401
    for method in ("GET", "DELETE"):
        assert (await http.request(method, base, headers=foreign)).status_code == 401
    assert mine.turns == [] and mine.id in gateway.sessions
    # The harness's own OpenAI client, with the key it was handed, is served.
    async with openai.AsyncOpenAI(base_url=base, api_key=mine.key, max_retries=0) as client:
        reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])  # type: ignore[list-item]
    assert reply.choices[0].message.content == "Done." and len(mine.turns) == 1 and other.turns == []
    # The runner's gateway has no route that reads or closes a session, whatever the key.
    for method in ("GET", "DELETE"):
        r = await http.request(method, base, headers={"Authorization": f"Bearer {mine.key}"})
        assert r.status_code in (404, 405), r.text
    assert mine.id in gateway.sessions
    gateway.close(mine.id)
    r = await http.post(f"{base}/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {mine.key}"})
    assert r.status_code == 401  # a closed session's key opens nothing


@pytest.mark.parametrize(
    ("headers", "code"),
    [
        ({"Host": "attacker.example"}, "forbidden_host"),
        ({"Host": "attacker.example:80"}, "forbidden_host"),
        ({"Origin": "http://attacker.example"}, "forbidden_origin"),
        ({"Origin": "null"}, "forbidden_origin"),
    ],
)
async def test_foreign_hosts_and_web_pages_are_refused(
    runner_gateway: tuple[Gateway, str], http: httpx.AsyncClient, headers: dict[str, str], code: str
) -> None:
    """DNS rebinding: a page's requests reach 127.0.0.1 with its own Host name, or with an Origin."""
    gateway, url = runner_gateway
    session = gateway.open()
    key = {"Authorization": f"Bearer {session.key}"}
    r = await http.post(f"{url}/v1/sessions/{session.id}/chat/completions", json=CHAT, headers={**key, **headers})
    assert r.status_code == 403 and r.json()["error_code"] == code, r.text
    assert session.turns == []


def _status(reply: bytes) -> int:
    line = reply.split(b"\r\n", 1)[0].split()
    assert len(line) >= 2 and line[0].startswith(b"HTTP/1."), reply[:200]
    return int(line[1])


def _send_large_body(base_url: str, key: str, total: int, *, chunked: bool) -> int:
    """POST ``total`` bytes of whitespace to the session's chat route, stopping once the server answers;
    the answer's status. A real socket: a server that stops reading is seen as one."""
    url = httpx.URL(base_url)
    port = url.port
    assert port is not None
    head = (
        f"POST {url.path}/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        + ("Transfer-Encoding: chunked\r\n" if chunked else f"Content-Length: {total}\r\n")
        + "\r\n"
    )
    block = b" " * MiB
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(head.encode())
        sent = 0
        try:
            while sent < total:
                if select.select([sock], [], [], 0)[0]:
                    break  # the server has answered: it reads no more
                sock.sendall(b"%x\r\n%s\r\n" % (len(block), block) if chunked else block)
                sent += len(block)
            else:
                if chunked:
                    sock.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        reply = b""
        while b"\r\n" not in reply:
            try:
                got = sock.recv(65536)
            except ConnectionResetError:
                break
            if not got:
                break
            reply += got
    return _status(reply)


def _peak_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


@pytest.fixture
def gateway_process() -> Iterator[tuple[subprocess.Popen[str], dict[str, Any]]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.inference.gateway_process"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, "the gateway process did not start"
        yield proc, json.loads(line)
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_96_mib_body_is_refused_without_growing_the_process(
    gateway_process: tuple[subprocess.Popen[str], dict[str, Any]], chunked: bool
) -> None:
    proc, opened = gateway_process
    headers = {"Authorization": f"Bearer {opened['api_key']}"}
    warm = httpx.post(f"{opened['base_url']}/chat/completions", json=CHAT, headers=headers, timeout=30)
    assert warm.status_code == 200, warm.text  # the route's own first-call costs are paid before measuring
    before = _peak_rss_kib(proc.pid)
    status = _send_large_body(opened["base_url"], opened["api_key"], 96 * MiB, chunked=chunked)
    grown_mib = (_peak_rss_kib(proc.pid) - before) / 1024
    assert status == 413
    # A declared length is refused before any of the body is read; a chunked body is read up to the
    # limit (16 MiB) and no further.
    assert grown_mib < (24 if chunked else 4), f"the gateway grew by {grown_mib:.0f} MiB"
    again = httpx.post(f"{opened['base_url']}/chat/completions", json=CHAT, headers=headers, timeout=30)
    assert again.status_code == 200, again.text
