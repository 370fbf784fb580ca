"""The call channel (GET /v1/channel upgraded to sandrl-channel/1): a real server, real sandboxes,
and a bare-socket client for what RemoteProvider would never send."""

from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import AsyncIterator
from typing import Any, cast
from urllib.parse import urlsplit

import httpx
import pytest

from sandrl.errors import SandboxError, SandboxNotFoundError, SandboxUnavailableError
from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.sandbox.remote import call_channel
from sandrl.sandbox.remote.config import ClientConfig
from sandrl.sandbox.remote.frames import (
    CHANNEL_PATH,
    MAX_HEAD,
    ChannelProtocolError,
    FrameReader,
    call_frame,
    frame,
)
from sandrl.sandbox.remote.http_pool import PooledTransport
from sandrl.sandbox.remote.provider import RemoteProvider, RemoteSandbox
from sandrl.sandbox.service.auth import send_error
from sandrl.sandbox.service.channel import ChannelProtocol
from sandrl.sandbox.service.server import BackgroundServer, create_app
from sandrl.sandbox.service.state import SandboxService, ServiceConfig

from .conftest import Served, serving


class RawChannel:
    """A channel opened by hand: frames in, frames out, nothing checked on the way."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.frames = FrameReader(1 << 30)
        self.pending: list[Any] = []
        self.ids = 0

    @classmethod
    async def upgrade(cls, url: str, headers: dict[str, str]) -> tuple[int, bytes, RawChannel]:
        """The upgrade's status and answer head, and the connection (a channel when the status is 101)."""
        parts = urlsplit(url)
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        lines = {"host": parts.netloc, "connection": "upgrade", "upgrade": "sandrl-channel/1", **headers}
        head = f"GET {CHANNEL_PATH} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in lines.items()) + "\r\n"
        writer.write(head.encode())
        answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        return int(answer.split(b" ", 2)[1]), answer, cls(reader, writer)

    async def body(self, answer_head: bytes) -> Any:
        length = next(
            int(line.split(b":", 1)[1])
            for line in answer_head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
        return json.loads(await asyncio.wait_for(self.reader.readexactly(length), 10))

    async def call(self, method: str, target: str, body: Any = None) -> tuple[int, Any]:
        self.ids += 1
        payload = b"" if body is None else json.dumps(body).encode()
        self.writer.write(call_frame(self.ids, method, target, payload))
        return await self.answer(self.ids)

    async def answer(self, call_id: int) -> tuple[int, Any]:
        while True:
            for f in self.pending:
                got, status = f.head.split(b" ")
                if int(got) == call_id:
                    self.pending.remove(f)
                    return int(status), json.loads(f.body) if f.body else None
            data = await asyncio.wait_for(self.reader.read(1 << 16), 60)
            if not data:
                raise ConnectionError("the server closed the channel")
            self.pending += self.frames.feed(data)

    async def closed_by_server(self) -> bool:
        try:
            return await asyncio.wait_for(self.reader.read(1 << 16), 10) == b""
        except ConnectionError:
            return True

    def close(self) -> None:
        self.writer.close()


@pytest.fixture
async def channel(served: Served) -> AsyncIterator[RawChannel]:
    status, _, raw = await RawChannel.upgrade(served.url, {"authorization": f"Bearer {served.token}"})
    assert status == 101
    yield raw
    raw.close()


# -- the framing


def test_frames_come_out_whole_however_the_bytes_arrive() -> None:
    wire = call_frame(1, "POST", "/v1/sandboxes", b'{"ttl_s": 60}') + call_frame(22, "DELETE", "/v1/sandboxes/a", b"")
    whole = FrameReader(1024).feed(wire)
    assert [(f.head, f.body) for f in whole] == [
        (b"1 POST /v1/sandboxes", b'{"ttl_s": 60}'),
        (b"22 DELETE /v1/sandboxes/a", b""),
    ]
    reader, got = FrameReader(1024), []
    for i in range(len(wire)):
        got += reader.feed(wire[i : i + 1])
    assert got == whole


def test_a_body_over_the_bound_is_dropped_as_it_comes_and_the_next_frame_is_read() -> None:
    reader = FrameReader(100)
    wire = frame(b"7 POST /x", b"y" * 5000) + frame(b"8 POST /x", b"{}")
    got = []
    for i in range(0, len(wire), 512):
        got += reader.feed(wire[i : i + 512])
        assert len(reader._buf) <= 512 + MAX_HEAD  # never the whole body
    assert [(f.head, f.body, f.size) for f in got] == [(b"7 POST /x", None, 5000), (b"8 POST /x", b"{}", 2)]


@pytest.mark.parametrize(
    "wire",
    [
        (MAX_HEAD + 100).to_bytes(4, "little") + b"x" * (MAX_HEAD + 100),  # no head line
        (3).to_bytes(4, "little") + b"abc\n",  # the head line ends past the frame
    ],
)
def test_a_frame_without_a_head_line_is_refused(wire: bytes) -> None:
    with pytest.raises(ChannelProtocolError):
        FrameReader(1 << 20).feed(wire)


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.reading, self.written, self.closed = True, b"", False

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


async def test_calls_past_max_in_flight_wait_unread_until_one_ends() -> None:
    release = asyncio.Event()
    started: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        started.append(scope["path"])
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": scope["path"].encode()})

    template = {"type": "http", "root_path": "", "headers": [], "state": {}}
    channel = ChannelProtocol(
        app, template, max_body=100, hot_calls=cast(Any, None), connections=set(), tasks=set(), max_in_flight=2
    )
    transport = _Transport()
    channel.connection_made(transport)
    channel.data_received(b"".join(call_frame(i, "GET", f"/c{i}", b"") for i in range(5)))
    await asyncio.sleep(0.05)
    assert started == ["/c0", "/c1"] and not transport.reading  # three wait, and nothing more is read
    release.set()
    for _ in range(20):
        await asyncio.sleep(0.01)
    assert started == [f"/c{i}" for i in range(5)] and transport.reading
    answers = FrameReader(100).feed(transport.written)
    assert sorted((f.head, f.body) for f in answers) == [(b"%d 200" % i, b"/c%d" % i) for i in range(5)]


# -- RemoteProvider on the channel


async def test_remote_provider_sends_its_calls_on_one_channel(remote: RemoteProvider, served: Served) -> None:
    sandboxes = await asyncio.gather(*(remote.create(SandboxSpec(ttl_s=120)) for _ in range(3)))
    try:
        results = await asyncio.gather(*(sb.exec(f"echo {i}; echo e >&2; exit {i}") for i, sb in enumerate(sandboxes)))
        assert [(r.exit_code, r.stdout, r.stderr) for r in results] == [(i, f"{i}\n", "e\n") for i in range(3)]
        assert (await sandboxes[0].refresh()).id == sandboxes[0].id
        await sandboxes[0].set_ttl(60)
    finally:
        for sb in sandboxes:
            await sb.close()
    assert remote._channel is not None and remote._channel._conn is not None and remote._channel._conn.open
    assert isinstance(remote._transport, PooledTransport) and remote._transport._open == 0  # no HTTP connection
    gauge = [line for line in served.service.metrics.render().splitlines() if line.startswith(b"sandrl_call_channels ")]
    assert float(gauge[0].split()[1]) >= 1


async def test_answers_come_back_as_calls_finish(remote: RemoteProvider) -> None:
    async with await remote.create(SandboxSpec(ttl_s=120)) as sb:
        order: list[str] = []

        async def run(name: str, command: str) -> None:
            await sb.exec(command)
            order.append(name)

        slow = asyncio.ensure_future(run("slow", "sleep 2"))
        await asyncio.sleep(0.2)
        await asyncio.gather(*(run(f"fast{i}", "true") for i in range(5)))
        assert "slow" not in order  # not behind the long exec
        await slow
        assert order[-1] == "slow"


async def test_typed_errors_are_those_of_http(remote: RemoteProvider, served: Served) -> None:
    with pytest.raises(SandboxNotFoundError) as over_channel:
        await remote.get("sb-nope")
    http_only = RemoteProvider(served.url, token=served.token, config=ClientConfig(channel=False, retries=0))
    async with http_only:
        with pytest.raises(SandboxNotFoundError) as over_http:
            await http_only.get("sb-nope")
    assert str(over_channel.value) == str(over_http.value)
    assert over_channel.value.http_status == over_http.value.http_status == 404


async def test_every_answer_on_the_channel_is_the_http_answer(
    channel: RawChannel, http: httpx.AsyncClient, remote: RemoteProvider
) -> None:
    async with await remote.create(SandboxSpec(ttl_s=120)) as sb:
        base = f"/v1/sandboxes/{sb.id}"
        calls: list[tuple[str, str, Any]] = [
            ("POST", base + "/exec", {"command": "echo hi; exit 3"}),
            ("POST", base + "/exec", {"command": "echo \u0000"}),  # invalid_request
            ("POST", base + "/exec", {"command": "true", "env": {"1BAD": "x"}}),  # invalid_spec
            ("POST", base + "/exec", {"command": "true", "timeout_s": -1}),  # FastAPI's validation
            ("POST", base + "/exec", {"nope": 1}),
            ("POST", "/v1/sandboxes/sb-nope/exec", {"command": "true"}),
            ("POST", "/v1/sandboxes/..%2Fx/exec", {"command": "true"}),
            ("POST", "/v1/sandboxes", {"cpus": -1}),
            ("POST", "/v1/sandboxes", {"image": "no-such-image"}),
            ("DELETE", "/v1/sandboxes/sb-nope", None),
            ("GET", "/v1/sandboxes/sb-nope", None),
            ("GET", "/v1/nothing-here", None),
            ("PATCH", base, {}),
            ("POST", base + "/timeout", {"ttl_s": 0}),
            ("GET", "/v1/sandboxes?token=x", None),  # credentials in a query are refused
            ("GET", "/healthz", None),
        ]
        for method, target, body in calls:
            status, answer = await channel.call(method, target, body)
            r = await http.request(method, target, json=body)
            want = r.json() if r.content else None
            if isinstance(want, dict) and "duration_s" in want:
                want["duration_s"] = answer["duration_s"]
            assert (status, answer) == (r.status_code, want), (method, target)


async def test_routes_that_stream_go_over_http(channel: RawChannel, remote: RemoteProvider) -> None:
    async with await remote.create(SandboxSpec(ttl_s=120)) as sb:
        for method, route in (("POST", "/exec/stream"), ("GET", "/files?path=a"), ("GET", "/tar?path=.")):
            status, answer = await channel.call(method, f"/v1/sandboxes/{sb.id}{route}", {})
            assert status == 400 and answer["error_code"] == "invalid_request" and "over HTTP" in answer["message"]


async def test_a_call_over_the_bound_is_413_and_the_channel_goes_on(bwrap: BwrapProvider) -> None:
    with serving(bwrap, ServiceConfig(max_live=10, max_json_bytes=64 << 10)) as s:
        status, _, raw = await RawChannel.upgrade(s.url, {"authorization": f"Bearer {s.token}"})
        assert status == 101
        try:
            code, answer = await raw.call("POST", "/v1/sandboxes", {"command": "x" * (100 << 10)})
            assert code == 413 and answer["error_code"] == "payload_too_large"
            assert (await raw.call("GET", "/healthz"))[0] == 200
        finally:
            raw.close()


@pytest.mark.parametrize(
    "wire",
    [
        frame(b"not a call head", b""),
        frame(b"1 post /v1/sandboxes", b""),  # the method in lower case
        frame(b"1 GET v1/sandboxes", b""),  # not a path
        (MAX_HEAD + 10).to_bytes(4, "little") + b"1 GET /" + b"a" * (MAX_HEAD + 10),
    ],
)
async def test_a_frame_that_is_not_a_call_closes_the_channel(channel: RawChannel, wire: bytes) -> None:
    channel.writer.write(wire)
    assert await channel.closed_by_server()


async def test_the_upgrade_needs_the_token(served: Served) -> None:
    for headers in ({}, {"authorization": "Bearer " + "x" * 40}, {"authorization": f"Basic {served.token}"}):
        status, head, raw = await RawChannel.upgrade(served.url, headers)
        try:
            assert status == 401 and (await raw.body(head))["error_code"] == "unauthorized"
            assert await raw.closed_by_server()
        finally:
            raw.close()


async def test_a_plain_get_of_the_channel_is_426(http: httpx.AsyncClient) -> None:
    r = await http.get(CHANNEL_PATH)
    assert r.status_code == 426 and r.json()["error_code"] == "upgrade_required"
    assert "Upgrade: sandrl-channel/1" in r.json()["message"]


async def test_a_tokenless_server_opens_no_channel_to_a_browser_or_a_foreign_name(bwrap: BwrapProvider) -> None:
    with serving(bwrap, token=None) as s:
        for headers, code in (
            ({"origin": "http://evil.example"}, "forbidden_origin"),
            ({"host": "evil.example"}, "forbidden_host"),
        ):
            status, head, raw = await RawChannel.upgrade(s.url, headers)
            try:
                assert status == 403 and (await raw.body(head))["error_code"] == code
            finally:
                raw.close()
        async with RemoteProvider(s.url, token="") as provider:
            async with await provider.create(SandboxSpec(ttl_s=60)) as sb:
                assert (await sb.exec("echo ok")).stdout == "ok\n"
            assert provider._channel is not None and provider._channel._conn is not None


async def test_a_server_without_the_channel_gets_the_calls_over_http(bwrap: BwrapProvider) -> None:
    service = SandboxService(bwrap, ServiceConfig(max_live=10))
    app = create_app(service, token=None)

    async def older_server(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == CHANNEL_PATH:
            await send_error(send, 404, "not_found", f"no route {CHANNEL_PATH}")
            return
        await app(scope, receive, send)

    with BackgroundServer(older_server) as server:
        async with RemoteProvider(server.url) as provider:
            async with await provider.create(SandboxSpec(ttl_s=60)) as sb:
                assert (await sb.exec("echo ok")).stdout == "ok\n"
            assert provider._channel is not None and not provider._channel.available


# -- failures


async def test_a_broken_channel_fails_the_calls_in_flight_and_the_next_call_opens_another(
    served: Served, remote: RemoteProvider
) -> None:
    async with await remote.create(SandboxSpec(ttl_s=120)) as sb:
        running = asyncio.ensure_future(sb.exec("sleep 5"))
        await asyncio.sleep(0.5)
        channels = [c for c in _connections(served) if isinstance(c, ChannelProtocol) and c.in_flight]
        assert len(channels) == 1
        loop = channels[0].loop
        assert channels[0].transport is not None
        loop.call_soon_threadsafe(channels[0].transport.close)
        with pytest.raises(SandboxUnavailableError) as lost:
            await running
        assert lost.value.error_code == "service_connection_lost" and "may or may not have run" in str(lost.value)
        assert (await sb.exec("echo again")).stdout == "again\n"  # on a new channel


async def test_a_call_that_overruns_its_wait_is_a_timeout_and_its_late_answer_is_dropped(
    remote: RemoteProvider,
) -> None:
    async with await remote.create(SandboxSpec(ttl_s=120)) as sb:
        with pytest.raises(SandboxError) as late:
            await remote.call("POST", f"/sandboxes/{sb.id}/exec", json={"command": "sleep 1"}, timeout=0.2)
        assert late.value.error_code == "service_timeout"
        await asyncio.sleep(1.2)  # the answer has come, to no one
        assert (await sb.exec("echo still")).stdout == "still\n"


async def test_draining_finishes_the_calls_in_flight(bwrap: BwrapProvider) -> None:
    with serving(bwrap, ServiceConfig(max_live=10, drain_grace_s=10)) as s:
        provider = RemoteProvider(s.url, token=s.token, config=ClientConfig(retries=0))
        sb: RemoteSandbox = await provider.create(SandboxSpec(ttl_s=60))
        running = asyncio.ensure_future(sb.exec("sleep 1; echo done"))
        await asyncio.sleep(0.3)
        stopping = asyncio.get_running_loop().run_in_executor(None, s.server.stop)
        assert (await running).stdout == "done\n"
        await stopping
        await provider.aclose()


def _connections(served: Served) -> list[Any]:
    return list(served.server._server.server_state.connections)


async def test_an_unexpected_error_is_answered_as_over_http(
    channel: RawChannel,
    http: httpx.AsyncClient,
    remote: RemoteProvider,
    served: Served,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug")

    async with await remote.create(SandboxSpec(ttl_s=120)) as sb:
        monkeypatch.setattr(served.service, "exec", broken)
        target = f"/v1/sandboxes/{sb.id}/exec"
        status, answer = await channel.call("POST", target, {"command": "true"})
        r = await http.post(target, json={"command": "true"})
        assert (status, answer) == (r.status_code, r.json()) and status == 500
        assert answer["error_code"] == "internal_error" and "a bug" in answer["message"]


@pytest.mark.parametrize("channel", [True, False])
@pytest.mark.filterwarnings(
    "ignore::pytest.PytestUnraisableExceptionWarning"
)  # the first loop's socket, closed when collected
def test_a_provider_serves_one_event_loop_after_another(served: Served, channel: bool) -> None:
    """A provider kept across ``asyncio.run`` calls opens a channel (or connections) on each loop."""
    provider = RemoteProvider(served.url, token=served.token, config=ClientConfig(channel=channel))

    async def once() -> str:
        async with await provider.create(SandboxSpec(ttl_s=60)) as sb:
            return (await sb.exec("echo hi")).stdout

    assert asyncio.run(once()) == "hi\n"
    assert asyncio.run(once()) == "hi\n"
    asyncio.run(provider.aclose())
    gc.collect()  # the first loop's transports warn here, not in a later test


async def test_the_server_stops_reading_while_its_client_does_not_read_answers() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        raise AssertionError("no call is made")

    template = {"type": "http", "root_path": "", "headers": [], "state": {}}
    channel = ChannelProtocol(app, template, max_body=100, hot_calls=cast(Any, None), connections=set(), tasks=set())
    transport = _Transport()
    channel.connection_made(transport)
    channel.pause_writing()  # the transport's buffer of unread answers passed its high-water mark
    assert not transport.reading
    channel.resume_writing()
    assert transport.reading


async def test_an_answer_over_the_clients_bound_fails_its_call_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(call_channel, "MAX_ANSWER", 100)
    conn = call_channel._Connection()
    conn.connection_made(_Transport())
    loop = asyncio.get_running_loop()
    big, small = loop.create_future(), loop.create_future()
    conn.waiters.update({1: big, 2: small})
    wire = b"HTTP/1.1 101 Switching Protocols\r\n\r\n" + frame(b"1 200", b"x" * 5000) + frame(b"2 200", b"{}")
    for i in range(0, len(wire), 700):
        conn.data_received(wire[i : i + 700])
    with pytest.raises(httpx.RemoteProtocolError, match="over 100"):
        big.result()
    assert small.result().status_code == 200 and small.result().content == b"{}"
    assert conn.open and len(conn._reader._buf) < 1000  # the big body was never held


async def test_no_call_starts_while_its_client_does_not_read_answers() -> None:
    """Calls read while writes are paused (or read in one burst with the write that pauses them)
    wait, the connection unread, until the client has drained its answers."""
    started: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        started.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"x"})

    template = {"type": "http", "root_path": "", "headers": [], "state": {}}
    channel = ChannelProtocol(app, template, max_body=100, hot_calls=cast(Any, None), connections=set(), tasks=set())
    transport = _Transport()
    channel.connection_made(transport)
    channel.pause_writing()
    channel.data_received(b"".join(call_frame(i, "GET", f"/c{i}", b"") for i in range(50)))
    await asyncio.sleep(0.05)
    assert started == [] and not transport.reading
    channel.resume_writing()
    for _ in range(20):
        await asyncio.sleep(0.01)
    assert started == [f"/c{i}" for i in range(50)] and transport.reading


def _rss() -> int:
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS:")).split()[1]) << 10


MiB = 1 << 20
CALLS = 3000
MAX_UNREAD = 16 * MiB
TURN = 48 * MiB
"""Answers of one turn of the server's event loop, queued before the bound is checked (8 of 6 MiB)."""
RSS_BOUND = 256 * MiB
"""What the server (in this process) may grow by for a client that never reads; its 3,000 answers of
1 MiB of NULs (6 MiB of JSON each) would be 18 GiB."""


async def test_a_client_that_never_reads_answers_does_not_grow_the_servers_memory(bwrap: BwrapProvider) -> None:
    """The attack: one write of thousands of calls with large answers, none of them read. The server
    stops reading the connection, and drops it once its answers unread pass the bound."""
    with serving(bwrap, ServiceConfig(max_unread_bytes=MAX_UNREAD)) as served:
        auth = {"authorization": f"Bearer {served.token}"}
        async with httpx.AsyncClient(base_url=served.url, headers=auth, timeout=60) as http:
            # pids bounds how many of the calls run at once (the memory of calls in flight is not this test's)
            sid = (await http.post("/v1/sandboxes", json={"ttl_s": 300, "pids": 64})).json()["id"]
            try:
                status, _, raw = await RawChannel.upgrade(served.url, auth)
                assert status == 101
                connections = served.server._server.server_state.connections
                channel = next(c for c in connections if isinstance(c, ChannelProtocol))
                body = json.dumps({"command": "head -c 1M /dev/zero", "timeout_s": 60}).encode()
                wire = b"".join(call_frame(i, "POST", f"/v1/sandboxes/{sid}/exec", body) for i in range(CALLS))
                before, peak_rss, peak_unread, quiet = _rss(), 0, 0, 0
                raw.writer.write(wire)
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 60
                while loop.time() < deadline and quiet < 20:
                    await asyncio.sleep(0.05)
                    peak_rss = max(peak_rss, _rss() - before)
                    transport = channel.transport
                    assert transport is not None
                    peak_unread = max(peak_unread, transport.get_write_buffer_size())
                    if peak_rss > RSS_BOUND or peak_unread > MAX_UNREAD + TURN:
                        break  # failed: stop before the host runs out of memory
                    settled = channel.lost.done() or (channel.in_flight == 0 and channel._write_paused)
                    quiet = quiet + 1 if settled else 0
                raw.close()
                assert peak_unread <= MAX_UNREAD + TURN, f"{peak_unread / MiB:.0f} MiB of answers held unread"
                assert peak_rss <= RSS_BOUND, (
                    f"the server grew by {peak_rss / MiB:.0f} MiB for a client that reads nothing"
                )
                assert channel.lost.done(), "a client that never reads is dropped once over the bound"
                # the server goes on serving others
                r = await http.post(f"/v1/sandboxes/{sid}/exec", json={"command": "echo ok"})
                assert r.status_code == 200 and r.json()["stdout"] == "ok\n"
            finally:
                await http.delete(f"/v1/sandboxes/{sid}")
