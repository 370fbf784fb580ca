"""A host port forwarded into a sandbox (sandrl.sandbox.forwarding, sandrl.sandbox.bwrap.port_forward),
with real sandboxes and real sockets, on loopback only: the host's services here are servers this
test starts on 127.0.0.1, and the sandbox's side is its own loopback."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sandrl.background_server import serve_on_loop
from sandrl.errors import ConfigError, PortForwardingUnsupportedError, SandboxError
from sandrl.inference.gateway import Gateway, create_gateway_app
from sandrl.peer_tags import tag_of_peer
from sandrl.sandbox.admission import AdmittedProvider, AdmittedSandbox, CommandAdmission
from sandrl.sandbox.base import SandboxSpec, forward_port, require_port_forwarding
from sandrl.sandbox.bwrap import BwrapProvider, BwrapSandbox
from sandrl.sandbox.bwrap.port_forward import forward_into
from sandrl.sandbox.bwrap.process import BwrapProcess
from sandrl.sandbox.delegating import DelegatingSandbox
from sandrl.sandbox.e2b.provider import E2BProvider
from sandrl.sandbox.forwarding import ForwardLimits
from sandrl.sandbox.remote.provider import RemoteProvider

from ..inference.test_gateway import ScriptedReplies
from ..support import needs_sandbox

pytestmark = needs_sandbox

INNER = 18765
"""The port forwarded into the sandboxes (the host's servers listen on ports the kernel picks)."""

PROBE = """
import json, socket, sys
out = {}
for port in map(int, sys.argv[1:]):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=3).close()
        out[port] = "connected"
    except OSError as exc:
        out[port] = type(exc).__name__
print(json.dumps(out))
"""
"""Connects to each port on the sandbox's loopback: what answered."""

HOLD = """
import socket, sys, time
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
c.sendall(b"x")
print("connected", flush=True)
c.settimeout(30)
try:
    print("ended" if c.recv(1) == b"" else "data", flush=True)
except ConnectionResetError:
    print("ended", flush=True)
"""
"""Holds one connection open until the other end closes it."""

MANY = """
import json, socket, sys
port, n = int(sys.argv[1]), int(sys.argv[2])

def connect():
    try:
        c = socket.create_connection(("127.0.0.1", port), timeout=5)
        c.sendall(b"x")
        return c
    except ConnectionResetError:  # reset on accept before connect() returned here
        return None

def state(c):
    if c is None:
        return "closed"
    c.settimeout(0.2)
    try:
        return "closed" if c.recv(1) == b"" else "data"
    except TimeoutError:
        return "open"
    except OSError:
        return "closed"

conns = [connect() for _ in range(n)]
print("opened", flush=True)
sys.stdin.readline()
states = [state(c) for c in conns]
for c in conns:
    if c is not None:
        c.close()
print("closed", flush=True)
sys.stdin.readline()
print(json.dumps(states + [state(connect())]), flush=True)
"""
"""Opens n connections at once; then, once they are closed, one more: how each fared."""


@dataclass
class HostService:
    """A server on a host loopback port, as the session gateway is: what reached it, and from whom."""

    port: int = 0
    peers: list[tuple[str, int]] = field(default_factory=list)
    tags: list[str | None] = field(default_factory=list)
    """:func:`tag_of_peer` of each client, asked as it connected (as the gateway asks)."""
    live: int = 0
    most_live: int = 0
    ended: asyncio.Event = field(default_factory=asyncio.Event)


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def host_service(handler: Handler | None = None) -> AsyncIterator[HostService]:
    """``handler`` (default: HTTP/1.1 answering ``tag=<tag of the client>``) on ``127.0.0.1:<free port>``."""
    service = HostService()

    async def http(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await reader.readuntil(b"\r\n\r\n")
            body = f"tag={service.tags[-1]}\n".encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")[:2]
        service.peers.append(peer)
        service.tags.append(tag_of_peer(*peer))
        service.live += 1
        service.most_live = max(service.most_live, service.live)
        try:
            await (handler or http)(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            service.live -= 1
            service.ended.set()
            writer.transport.abort()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    service.port = server.sockets[0].getsockname()[1]
    try:
        yield service
    finally:
        server.close()


async def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "not within the time"
        await asyncio.sleep(0.01)


async def run_script(sandbox: BwrapSandbox | AdmittedSandbox, script: str, *args: object) -> str:
    await sandbox.write_file("/tmp/script.py", script.encode())
    done = await sandbox.exec("python3 /tmp/script.py " + " ".join(map(str, args)), timeout_s=30)
    assert done.ok, done.stderr
    return done.stdout


async def curl(sandbox: BwrapSandbox | AdmittedSandbox, port: int = INNER) -> str:
    done = await sandbox.exec(f"curl -sS --max-time 5 http://127.0.0.1:{port}/v1/models", timeout_s=30)
    assert done.ok, done.stderr
    return done.stdout


def listening_ports(proc_net_tcp: str) -> set[int]:
    """Ports with a socket in LISTEN state in a ``/proc/net/tcp``'s text."""
    ports = set()
    for line in proc_net_tcp.splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        if state == "0A":
            ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


@pytest.mark.parametrize("network", [False, True], ids=["loopback-only", "network"])
async def test_the_forwarded_service_answers_inside_and_nothing_else_of_the_host_is_reachable(
    either_launch: BwrapProvider, network: bool
) -> None:
    async with host_service() as gateway, host_service() as other:
        async with await either_launch.create(SandboxSpec(ttl_s=120, network=network)) as sandbox:
            forward = await sandbox.forward_port(INNER, ("127.0.0.1", gateway.port))
            assert (forward.port, forward.tag) == (INNER, sandbox.id)

            assert await curl(sandbox) == f"tag={sandbox.id}\n"
            reached = json.loads(await run_script(sandbox, PROBE, gateway.port, other.port, INNER))
            refused = "ConnectionRefusedError"
            assert reached == {str(gateway.port): refused, str(other.port): refused, str(INNER): "connected"}

            # Its own network namespace: its own loopback (and its NAT's tap), none of the host's
            # sockets; the one listener of the host's making is the forward's.
            seen = await sandbox.exec("readlink /proc/self/ns/net; cat /proc/net/dev; echo ==; cat /proc/net/tcp")
            netns, rest = seen.stdout.split("\n", 1)
            devices, tcp = rest.split("==\n")
            assert netns != os.readlink("/proc/self/ns/net")
            names = {line.split(":")[0].strip() for line in devices.splitlines()[2:]}
            assert names == ({"lo", "tap0"} if network else {"lo"})
            assert listening_ports(tcp) == {INNER}
            assert listening_ports(Path("/proc/net/tcp").read_text()) >= {gateway.port, other.port}
        assert other.peers == [] and gateway.tags[0] == sandbox.id


async def test_each_relayed_connection_is_tagged_with_its_sandbox_and_nothing_else_is(provider: BwrapProvider) -> None:
    async with host_service() as gateway:
        async with (
            await provider.create(SandboxSpec(ttl_s=120)) as one,
            await provider.create(SandboxSpec(ttl_s=120)) as two,
        ):
            await one.forward_port(INNER, ("127.0.0.1", gateway.port))
            await two.forward_port(INNER + 1, ("127.0.0.1", gateway.port))
            assert await curl(one) == f"tag={one.id}\n"
            assert await curl(two, INNER + 1) == f"tag={two.id}\n"
            assert await curl(one) == f"tag={one.id}\n"

            # A client of the host's own, on the same loopback: no sandbox's.
            reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
            assert await reader.readline() == b"tag=None\n"
            writer.close()
            await writer.wait_closed()
        assert gateway.tags == [one.id, two.id, one.id, None]
        # A relayed connection's port is forgotten once it closed: whoever takes it next is nobody's.
        await until(lambda: gateway.live == 0)
        assert all(tag_of_peer(*peer) is None for peer in gateway.peers)
    assert tag_of_peer("127.0.0.1", 0) is None and tag_of_peer("not an address", 80) is None


async def test_the_forward_ends_with_its_sandbox(provider: BwrapProvider) -> None:
    async with host_service(_hold_until_eof) as gateway:
        sandbox = await provider.create(SandboxSpec(ttl_s=120))
        try:
            forward = await sandbox.forward_port(INNER, ("127.0.0.1", gateway.port))
            await sandbox.write_file("/tmp/hold.py", HOLD.encode())
            await sandbox.spawn(f"python3 /tmp/hold.py {INNER}", timeout_s=60)
            await until(lambda: gateway.live == 1)
            peer = gateway.peers[0]
            assert tag_of_peer(*peer) == sandbox.id and forward.connections == 1 and forward.listening
            assert tag_of_peer(f"::ffff:{peer[0]}", peer[1]) == sandbox.id  # as a dual-stack server sees it
        finally:
            await sandbox.close()
        await asyncio.wait_for(gateway.ended.wait(), 5)
        assert forward.closed and not forward.listening
        await until(lambda: forward.connections == 0)
        assert tag_of_peer(*peer) is None
        with pytest.raises(SandboxError):
            await sandbox.forward_port(INNER, ("127.0.0.1", gateway.port))


async def test_closing_the_forward_stops_it_and_its_connections(sandbox: BwrapSandbox) -> None:
    async with host_service(_hold_until_eof) as gateway:
        forward = await sandbox.forward_port(INNER, ("127.0.0.1", gateway.port))
        await sandbox.write_file("/tmp/hold.py", HOLD.encode())
        held = await sandbox.spawn(f"python3 /tmp/hold.py {INNER}", timeout_s=60)
        await until(lambda: gateway.live == 1)
        await forward.close()
        assert forward.connections == 0 and not forward.listening
        assert (await held.wait()).stdout == "connected\nended\n"
        await asyncio.wait_for(gateway.ended.wait(), 5)
        assert json.loads(await run_script(sandbox, PROBE, INNER)) == {str(INNER): "ConnectionRefusedError"}
        await forward.close()  # idempotent
        # The port is free again in the sandbox: forwarded anew, it answers.
        again = await sandbox.forward_port(INNER, ("127.0.0.1", gateway.port))
        assert json.loads(await run_script(sandbox, PROBE, INNER)) == {str(INNER): "connected"}
        await again.close()


async def test_connections_at_once_are_bounded(sandbox: BwrapSandbox) -> None:
    async with host_service(_hold_until_eof) as gateway:
        forward = await forward_into(sandbox, INNER, ("127.0.0.1", gateway.port), ForwardLimits(max_connections=4))
        await sandbox.write_file("/tmp/many.py", MANY.encode())
        many = await sandbox.spawn(f"python3 /tmp/many.py {INNER} 10", stdin=True, timeout_s=60)
        stderr: list[bytes] = []
        lines = _lines(many, stderr)

        async def line() -> str:
            got = await anext(lines, None)
            if got is None:
                ended = await many.wait()
                raise AssertionError(f"the probe ended ({ended.exit_code}): {b''.join(stderr)!r} {ended.stderr!r}")
            return got

        assert await line() == "opened"
        await until(lambda: forward.refused == 6 and gateway.live == 4)
        await many.write_stdin(b"go\n")
        assert await line() == "closed"
        await until(lambda: forward.connections == 0 and gateway.live == 0)
        await many.write_stdin(b"go\n")
        states = json.loads(await line())
        # The first four were relayed and stayed open, the other six were reset on accept; once the
        # four were closed a new connection was relayed again.
        assert states[:10].count("open") == 4 and states[:10].count("closed") == 6, states
        assert states[10] == "open"
        assert gateway.most_live == 4 and forward.refused == 6 and forward.relayed == 5
        await many.wait()


async def _lines(process: BwrapProcess, stderr: list[bytes]) -> AsyncIterator[str]:
    """A process's stdout, line by line; its stderr goes to ``stderr`` meanwhile."""
    pending = b""
    async for chunk in process.output():
        if chunk.stream == "stderr":
            stderr.append(chunk.data)
        else:
            pending += chunk.data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                yield line.decode()


async def test_idle_connections_time_out_and_busy_ones_do_not(sandbox: BwrapSandbox) -> None:
    async with host_service(_echo) as gateway:
        limits = ForwardLimits(idle_timeout_s=0.6)
        await forward_into(sandbox, INNER, ("127.0.0.1", gateway.port), limits)
        script = """
import socket, sys, time
idle = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
busy = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
for _ in range(30):  # 1.5 s, over two idle timeouts, a byte each way every 0.05 s
    busy.sendall(b"x")
    assert busy.recv(1) == b"x"
    time.sleep(0.05)
idle.settimeout(2)
print("idle", "ended" if idle.recv(1) == b"" else "data", "busy", "open")
"""
        assert await run_script(sandbox, script, INNER) == "idle ended busy open\n"


async def test_bytes_stream_both_ways_and_a_reader_that_stops_holds_little(sandbox: BwrapSandbox) -> None:
    size = 32 << 20
    payload = os.urandom(1 << 20) * 32

    async def send_payload(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        what = await reader.readexactly(1)
        if what == b"d":  # download: the payload; "u": upload, its digest back
            writer.write(payload)
            await writer.drain()
            writer.write_eof()
            await reader.read()
        else:
            digest = hashlib.sha256()
            while chunk := await reader.read(1 << 16):
                digest.update(chunk)
            writer.write(digest.hexdigest().encode())
            await writer.drain()

    async with host_service(send_payload) as gateway:
        await sandbox.forward_port(INNER, ("127.0.0.1", gateway.port))
        script = """
import hashlib, os, socket, sys
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
c.sendall(b"d")
got, digest = 0, hashlib.sha256()
while chunk := c.recv(1 << 16):
    got += len(chunk); digest.update(chunk)
c.close()
u = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
data = os.urandom(8 << 20)
u.sendall(b"u" + data); u.shutdown(socket.SHUT_WR)
print(got, digest.hexdigest(), u.recv(100).decode() == hashlib.sha256(data).hexdigest())
"""
        got, digest, upload_ok = (await run_script(sandbox, script, INNER)).split()
        assert (int(got), digest, upload_ok) == (size, hashlib.sha256(payload).hexdigest(), "True")

    taken: list[int] = []

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Offer 256 MiB in 1 s to a client that reads 16 MiB (the kernel grows buffers that are not
        # fixed as they carry bytes) and then nothing: count what went past the first 16 MiB.
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 << 10)
        chunk, sent = b"\0" * (1 << 20), 0
        deadline = time.monotonic() + 1.0
        while sent < 256 << 20 and time.monotonic() < deadline:
            writer.write(chunk)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(deadline - time.monotonic()):
                    await writer.drain()
            sent += len(chunk)
        taken.append(sent - writer.transport.get_write_buffer_size() - (16 << 20))

    async with host_service(flood) as gateway:
        await sandbox.forward_port(INNER + 1, ("127.0.0.1", gateway.port))
        script = """
import socket, sys, time
c = socket.socket()
c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
c.connect(("127.0.0.1", int(sys.argv[1])))
got = 0
while got < 16 << 20:
    got += len(c.recv(1 << 16))
time.sleep(1.5)
print("done")
"""
        assert await run_script(sandbox, script, INNER + 1) == "done\n"
    # What the host's kernel and the relay hold between a sender and a reader that stopped: its
    # sockets' fixed buffers and a chunk or two, ~1.6 MiB here (with buffers left to the kernel's
    # autotuning, 4-10 MiB), not what was offered.
    assert len(taken) == 1 and taken[0] < 3 << 20, taken


async def test_an_answer_written_in_parts_is_not_held_back(sandbox: BwrapSandbox) -> None:
    """A server writes an answer's head and body apart (uvicorn does), a client sends its request so
    (http.client does): without TCP_NODELAY on the relay's sockets each second part waited for the
    ACK of the first, which the reader delays, ~40 ms a request (44 ms median here)."""

    async def head_then_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
            )
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n")
            await asyncio.sleep(0.002)
            writer.write(b"hello")
            await writer.drain()

    script = """
import http.client, sys, time
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]))
times = []
for _ in range(20):
    start = time.perf_counter()
    c.request("POST", "/v1/messages", body=b"{}" * 50, headers={"Content-Type": "application/json"})
    assert c.getresponse().read() == b"hello"
    times.append(time.perf_counter() - start)
print(sorted(times)[len(times) // 2])
"""
    async with host_service(head_then_body) as gateway:
        await sandbox.forward_port(INNER, ("127.0.0.1", gateway.port))
        median_s = float(await run_script(sandbox, script, INNER))
    assert median_s < 0.02, f"{median_s * 1000:.1f} ms a request"


async def test_the_session_gateway_answers_through_a_forward_and_sees_which_sandbox_asked(
    sandbox: BwrapSandbox,
) -> None:
    """The runner's gateway (uvicorn, its loopback-only, key and sandbox guards) from inside: the session
    bound to the sandbox is served with its key; another session's key is refused, on either session's
    URL; and the client address the app sees names the sandbox, whatever proxy header it sends."""
    gateway = Gateway(ScriptedReplies(["Done."]), model_name="scripted")
    app = create_gateway_app(gateway)
    askers: list[str | None] = []

    async def who_asked(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            askers.append(tag_of_peer(*scope["client"]))
        await app(scope, receive, send)

    mine, other = gateway.open(), gateway.open()
    async with serve_on_loop(who_asked, name="gateway") as url:
        forward = await sandbox.forward_port(INNER, ("127.0.0.1", int(url.rsplit(":", 1)[1])))
        mine.sandbox = forward.tag  # a session answers a sandbox's forward only once bound to it (as a CLI's is)

        async def status(path: str, key: str, body: str | None = None, session: str = mine.id) -> str:
            base = f"http://127.0.0.1:{INNER}/v1/sessions/{session}"
            data = f"-H 'Content-Type: application/json' -d '{body}' " if body else ""
            # X-Forwarded-For too: a server that trusted it from loopback (uvicorn's default) took the
            # sandbox's word for its address, and the sandbox passed for nobody's.
            done = await sandbox.exec(
                f"curl -sS -o /dev/null -w '%{{http_code}}' -H 'Authorization: Bearer {key}' "
                f"-H 'X-Forwarded-For: 127.0.0.9' {data}{base}{path}"
            )
            assert done.ok, done.stderr
            return done.stdout

        chat = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert await status("/models", mine.key) == "200"
        assert await status("/chat/completions", mine.key, chat) == "200"
        assert await status("/models", other.key) == "401"
        # Another session, with its own key: not this sandbox's (the gateway's sandbox binding).
        assert await status("/models", other.key, session=other.id) == "403"
    assert askers == [sandbox.id] * 4
    assert len(gateway.get(mine.id).turns) == 1 and not gateway.get(other.id).turns


async def test_bad_forwards_are_refused_with_what_to_do(sandbox: BwrapSandbox) -> None:
    for port, target in [
        (0, ("127.0.0.1", 80)),
        (70000, ("127.0.0.1", 80)),
        (INNER, ("10.0.0.1", 80)),
        (INNER, ("0.0.0.0", 80)),
        (INNER, ("localhost", 80)),
        (INNER, ("127.0.0.1", 0)),
        (INNER, "127.0.0.1:80"),
    ]:
        with pytest.raises(ConfigError):
            await sandbox.forward_port(port, target)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        ForwardLimits(max_connections=0)
    with pytest.raises(ConfigError):
        ForwardLimits(idle_timeout_s=float("inf"))

    # A port the sandbox listens on already is its own.
    await sandbox.write_file(
        "/tmp/listen.py",
        b"import socket, sys, time\ns = socket.socket()\ns.bind(('127.0.0.1', int(sys.argv[1])))\n"
        b"s.listen()\nprint('up', flush=True)\ntime.sleep(60)\n",
    )
    listening = await sandbox.spawn(f"python3 /tmp/listen.py {INNER}", timeout_s=60)
    async for chunk in listening.output():
        if b"up" in chunk.data:
            break
    with pytest.raises(SandboxError, match=f"port {INNER} is in use"):
        await sandbox.forward_port(INNER, ("127.0.0.1", 80))
    await listening.signal(9)
    await listening.wait()


async def test_backends_without_forwarding_say_what_to_use(provider: BwrapProvider) -> None:
    require_port_forwarding(provider, "the claude-code agent")
    admission = CommandAdmission(4)
    require_port_forwarding(AdmittedProvider(provider, admission), "the claude-code agent")
    for other in (RemoteProvider("http://127.0.0.1:9"), E2BProvider()):
        with pytest.raises(PortForwardingUnsupportedError, match='sandboxes = "local"') as refused:
            require_port_forwarding(other, "the claude-code agent")
        assert type(other).__name__ in str(refused.value) and "the claude-code agent" in str(refused.value)
        await other.aclose()

    async with host_service() as gateway, await provider.create(SandboxSpec(ttl_s=120)) as sandbox:
        # A wrapper that offers forwarding passes it on; one that does not is refused by name.
        admitted = AdmittedSandbox(sandbox, admission)
        forward = await forward_port(admitted, INNER, ("127.0.0.1", gateway.port))
        assert await curl(admitted) == f"tag={sandbox.id}\n"
        await forward.close()
        with pytest.raises(PortForwardingUnsupportedError, match="bubblewrap"):
            await forward_port(DelegatingSandbox(sandbox), INNER, ("127.0.0.1", gateway.port))


async def _hold_until_eof(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.read()


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(1 << 16):
        writer.write(data)
        await writer.drain()
