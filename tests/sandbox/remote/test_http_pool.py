"""The client's connection pool against a real HTTP/1.1 server on loopback, misbehaving on purpose."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from sandrl.sandbox.remote.http_pool import Answer, PooledTransport


class Server:
    """A tiny HTTP/1.1 server: answers ``GET /n`` with a body of n bytes, chunked for ``/chunked``, with
    no length (then closes) for ``/until-close``, after a ``100 Continue`` for ``/continue``, and not
    in HTTP for ``/garbage``;
    with ``hang_up_on_second`` it reads a connection's second request and closes without an answer
    (a keep-alive connection the server dropped just as the client reused it)."""

    def __init__(self, *, hang_up_on_second: bool = False, delay_s: float = 0.0) -> None:
        self.hang_up_on_second = hang_up_on_second
        self.delay_s = delay_s
        self.connections = 0
        self.open = 0
        self.most_open = 0
        self.requests: list[str] = []

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line = head.split(b"\r\n", 1)[0].decode()
                length = 0
                for header in head.split(b"\r\n")[1:]:
                    if header.lower().startswith(b"content-length:"):
                        length = int(header.split(b":")[1])
                if length:
                    await reader.readexactly(length)
                self.requests.append(line)
                served += 1
                if self.hang_up_on_second and served == 2:
                    return
                await asyncio.sleep(self.delay_s)
                _method, target, _ = line.split(" ")
                if target == "/until-close":
                    writer.write(b"HTTP/1.1 200 OK\r\nX-Framing: none\r\n\r\nto the end")
                    await writer.drain()
                    return
                if target == "/garbage":
                    writer.write(b"SMTP ready\r\n\r\n")
                    await writer.drain()
                    return
                if target == "/continue":
                    writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                    writer.write(b"HTTP/1.1 201 Created\r\nContent-Length: 4\r\n\r\nmade")
                elif target == "/chunked":
                    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                    for part in (b"hello ", b"chunked ", b"world"):
                        writer.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
                    writer.write(b"0\r\n\r\n")
                else:
                    body = b"x" * int(target.strip("/") or 0)
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.open -= 1
            writer.close()

    async def stop(self) -> None:
        self.server.close()


@pytest.fixture
async def make_server() -> AsyncIterator[type[Server]]:
    made: list[Server] = []

    class Tracked(Server):
        def __init__(self, **kw: object) -> None:
            super().__init__(**kw)  # type: ignore[arg-type]
            made.append(self)

    yield Tracked
    for s in made:
        await s.stop()


async def test_connections_are_reused_and_bodies_framed(make_server: type[Server]) -> None:
    server = make_server()
    url = await server.start()
    async with httpx.AsyncClient(transport=PooledTransport(max_connections=4)) as client:
        for n in (0, 10, 70000, 5):
            r = await client.get(f"{url}/{n}")
            assert r.status_code == 200 and r.content == b"x" * n
        r = await client.get(f"{url}/chunked")
        assert r.content == b"hello chunked world"
        r = await client.post(f"{url}/3", content=b"body")
        assert r.content == b"xxx"
        assert server.connections == 1  # one keep-alive connection did it all
        r = await client.get(f"{url}/until-close")  # no length: the body ends with the connection
        assert r.content == b"to the end"
        assert (await client.get(f"{url}/continue")).status_code == 201
    assert server.connections == 2


async def test_the_pool_never_opens_more_than_its_limit(make_server: type[Server]) -> None:
    server = make_server(delay_s=0.05)
    url = await server.start()
    async with httpx.AsyncClient(transport=PooledTransport(max_connections=3)) as client:
        answers = await asyncio.gather(*(client.get(f"{url}/7") for _ in range(20)))
    assert all(r.content == b"x" * 7 for r in answers)
    assert server.most_open <= 3 and server.connections <= 3


async def test_a_pool_wait_is_bounded(make_server: type[Server]) -> None:
    server = make_server(delay_s=1.0)
    url = await server.start()
    async with httpx.AsyncClient(transport=PooledTransport(max_connections=1)) as client:
        slow = asyncio.create_task(client.get(f"{url}/1"))
        await asyncio.sleep(0.1)
        with pytest.raises(httpx.PoolTimeout):
            await client.get(f"{url}/1", timeout=httpx.Timeout(5.0, pool=0.2))
        assert (await slow).content == b"x"


async def test_a_dropped_keepalive_connection_is_retried_only_when_safe(make_server: type[Server]) -> None:
    server = make_server(hang_up_on_second=True)
    url = await server.start()
    async with httpx.AsyncClient(transport=PooledTransport(max_connections=4)) as client:
        assert (await client.get(f"{url}/1")).content == b"x"
        # The GET meets the hang-up on the reused connection and goes again on a new one.
        assert (await client.get(f"{url}/2")).content == b"xx"
        assert server.connections == 2
        # A POST that met it may have run: the caller hears so instead of a silent second run.
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post(f"{url}/3", content=b"once")
    assert server.requests.count("POST /3 HTTP/1.1") == 1


async def test_a_streamed_body_is_never_sent_twice(make_server: type[Server]) -> None:
    """A streamed upload that meets a dropped keep-alive connection fails as a broken connection, once:
    its stream is partly read and cannot go again (before, the retry ended in httpx's StreamConsumed)."""
    server = make_server(hang_up_on_second=True)
    url = await server.start()

    async def upload() -> AsyncIterator[bytes]:
        for _ in range(64):
            yield b"y" * 65536
            await asyncio.sleep(0)

    async with httpx.AsyncClient(transport=PooledTransport(max_connections=4)) as client:
        assert (await client.get(f"{url}/1")).content == b"x"
        with pytest.raises((httpx.WriteError, httpx.RemoteProtocolError)):
            await client.put(f"{url}/2", content=upload())
    assert server.requests.count("PUT /2 HTTP/1.1") == 1


async def test_a_refused_connection_is_a_connect_error() -> None:
    async with httpx.AsyncClient(transport=PooledTransport(max_connections=2)) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get("http://127.0.0.1:9/")


def _origin(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def _head(method: str, target: str, body: bytes = b"") -> bytes:
    return f"{method} {target} HTTP/1.1\r\nhost: t\r\ncontent-length: {len(body)}\r\n\r\n".encode()


async def _fetch(pool: PooledTransport, url: str, method: str, target: str, body: bytes = b"") -> Answer:
    return await pool.fetch(_origin(url), method, _head(method, target, body), body, timeout=5)


async def test_fetch_reads_whole_answers_on_one_connection(make_server: type[Server]) -> None:
    server = make_server()
    url = await server.start()
    pool = PooledTransport(max_connections=4)
    try:
        for n in (0, 10, 70000, 5):
            answer = await _fetch(pool, url, "GET", f"/{n}")
            assert (answer.status_code, answer.reason_phrase, answer.content) == (200, "OK", b"x" * n)
        assert (await _fetch(pool, url, "GET", "/chunked")).content == b"hello chunked world"
        answer = await _fetch(pool, url, "POST", "/continue", b"body")  # the 1xx is skipped
        assert (answer.status_code, answer.content) == (201, b"made")
        assert (await _fetch(pool, url, "POST", "/3", b"body")).content == b"xxx"
        assert server.connections == 1
        assert server.requests[-1] == "POST /3 HTTP/1.1"
    finally:
        await pool.aclose()


async def test_fetch_ends_an_unframed_answer_at_close_and_drops_the_connection(make_server: type[Server]) -> None:
    server = make_server()
    url = await server.start()
    pool = PooledTransport(max_connections=4)
    try:
        answer = await _fetch(pool, url, "GET", "/until-close")
        assert answer.content == b"to the end" and (b"X-Framing", b"none") in answer.headers
        assert (await _fetch(pool, url, "GET", "/2")).content == b"xx"
        assert server.connections == 2  # the first could not carry a second answer
        with pytest.raises(httpx.RemoteProtocolError, match=r"not HTTP/1\.1"):
            await _fetch(pool, url, "GET", "/garbage")
        assert (await _fetch(pool, url, "GET", "/1")).content == b"x"
    finally:
        await pool.aclose()


async def test_fetch_sends_again_only_what_cannot_run_twice(make_server: type[Server]) -> None:
    server = make_server(hang_up_on_second=True)
    url = await server.start()
    pool = PooledTransport(max_connections=4)
    try:
        assert (await _fetch(pool, url, "GET", "/1")).content == b"x"
        assert (await _fetch(pool, url, "GET", "/2")).content == b"xx"  # again, on a new connection
        assert server.connections == 2
        with pytest.raises(httpx.RemoteProtocolError):
            await _fetch(pool, url, "POST", "/3", b"once")
        assert server.requests.count("POST /3 HTTP/1.1") == 1
    finally:
        await pool.aclose()


async def test_fetch_is_bounded_in_time(make_server: type[Server]) -> None:
    server = make_server(delay_s=2.0)
    url = await server.start()
    pool = PooledTransport(max_connections=2)
    try:
        with pytest.raises(httpx.ReadTimeout):
            await pool.fetch(_origin(url), "GET", _head("GET", "/1"), timeout=0.2)
    finally:
        await pool.aclose()
