"""Hostile clients of the native API (security issue #18): bodies over a sandbox's disk, a
client that never reads, a page in a local browser, half-sent requests."""

from __future__ import annotations

import os
import socket
import tarfile
import time
from collections.abc import Iterator

import httpx
import pytest

from sandrl.sandbox.bwrap import BwrapProvider

from ...support import needs_sandbox
from . import raw
from .conftest import Served, serving

pytestmark = needs_sandbox

MiB = 1 << 20


@pytest.fixture
def http(served: Served) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.url, headers={"Authorization": f"Bearer {served.token}"}, timeout=60) as c:
        yield c


@pytest.fixture
def small_disk(http: httpx.Client) -> Iterator[str]:
    r = http.post("/v1/sandboxes", json={"disk_mb": 16, "ttl_s": 120})
    assert r.status_code == 201, r.text
    sid: str = r.json()["id"]
    yield sid
    http.delete(f"/v1/sandboxes/{sid}")


def _megabytes(n: int) -> Iterator[bytes]:
    block = os.urandom(MiB)
    for _ in range(n):
        yield block


def _tar_stream(n_mib: int) -> Iterator[bytes]:
    """A tar archive of one ``n_mib`` MiB member, produced as it is sent."""
    info = tarfile.TarInfo("big.bin")
    info.size = n_mib * MiB
    yield info.tobuf(format=tarfile.GNU_FORMAT)
    yield from _megabytes(n_mib)


@pytest.mark.parametrize("route", ["files", "tar"])
@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_upload_over_the_sandbox_disk_is_cut_before_it_reaches_the_host(
    served: Served, small_disk: str, route: str, declared: bool
) -> None:
    """A 128 MiB upload into a 16 MiB sandbox: refused up front when declared, cut at the bound when streamed."""
    size = 128
    headers = {"Authorization": f"Bearer {served.token}", "Content-Type": "application/octet-stream"}
    body = _megabytes(size) if route == "files" else _tar_stream(size)
    if declared:
        headers["Content-Length"] = str(size * MiB + (512 if route == "tar" else 0))
    target = f"/v1/sandboxes/{small_disk}/{route}?path=" + ("big.bin" if route == "files" else "unpacked")
    answer = raw.request(served.url, "PUT", target, headers, body, chunked=not declared)
    assert answer.status == 413, answer.body
    error = answer.json()
    assert error["error_code"] == "payload_too_large" and "disk_mb" in error["message"]
    # The socket buffers hold a few MiB; the server itself must not take more than the disk.
    assert answer.sent < (0 if declared else 16 * MiB) + 24 * MiB, f"the server read {answer.sent >> 20} MiB"


def test_upload_to_an_unknown_sandbox_is_refused_before_its_body(served: Served) -> None:
    headers = {"Authorization": f"Bearer {served.token}", "Content-Length": str(64 * MiB)}
    for route in ("files", "tar"):
        answer = raw.request(served.url, "PUT", f"/v1/sandboxes/sb-nope/{route}?path=x", headers, timeout_s=5)
        assert answer.status == 404 and answer.json()["error_code"] == "sandbox_not_found"


def _rss() -> int:
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith("VmRSS:"))
    return int(line.split()[1]) << 10


def test_tar_download_to_a_client_that_never_reads_stays_bounded(served: Served, http: httpx.Client) -> None:
    """GET /tar of /usr (GBs) with a client that reads nothing: the server (in this process) must not buffer it."""
    r = http.post("/v1/sandboxes", json={"ttl_s": 120})
    sid = r.json()["id"]
    try:
        before = _rss()
        sock = raw.connect(served.url, rcvbuf=4096)
        try:
            sock.sendall(
                raw.head(
                    "GET", f"/v1/sandboxes/{sid}/tar?path=/usr", served.url, {"Authorization": f"Bearer {served.token}"}
                )
            )
            time.sleep(3)
            grown = _rss() - before
            # tar is still there, stalled by the client rather than killed or run to its end.
            script = 'for s in /proc/[0-9]*/stat; do read -r l < "$s" && echo "$l"; done 2>/dev/null | grep -F "(tar)"'
            states = http.post(f"/v1/sandboxes/{sid}/exec", json={"command": script}).json()["stdout"]
        finally:
            sock.close()
        assert grown < 64 * MiB, f"the server grew by {grown >> 20} MiB for a client that reads nothing"
        assert states and all(line.split(") ")[1][0] in "TSt" for line in states.splitlines()), states
    finally:
        http.delete(f"/v1/sandboxes/{sid}")


@pytest.fixture(scope="module")
def tokenless(bwrap: BwrapProvider) -> Iterator[Served]:
    with serving(bwrap, token=None) as s:
        yield s


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/sandboxes", {"network": True}),
        ("GET", "/v1/sandboxes", None),
        ("POST", "/v2/sandboxes", {"templateID": "base", "allow_internet_access": True}),
        ("GET", "/healthz", None),
    ],
)
def test_a_tokenless_server_answers_only_loopback_names_and_no_browser(
    tokenless: Served, method: str, path: str, body: object
) -> None:
    """DNS rebinding: a page's requests reach 127.0.0.1 with its own Host name, and always with an Origin."""
    port = tokenless.url.rsplit(":", 1)[1]
    refused = [
        {"Host": f"evil.example:{port}"},
        {"Host": "evil.example"},
        {"Host": f"127.0.0.1.nip.io:{port}"},
        {"Host": f"localhost:{port}", "Origin": "http://evil.example"},
        {"Host": f"127.0.0.1:{port}", "Origin": "null"},
    ]
    with httpx.Client(base_url=tokenless.url, timeout=60) as c:
        for headers in refused:
            r = c.request(method, path, json=body, headers=headers)
            assert r.status_code in (403, 421), (headers, r.status_code, r.text)
            error = r.json()
            assert set(error) == {"code", "error_code", "message"} and error["code"] == r.status_code
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", "127.9.9.9", "LOCALHOST"):
            r = c.request("GET", "/v1/sandboxes", headers={"Host": host})
            assert r.status_code == 200, (host, r.text)
        # envd traffic too
        r = c.get("/files", params={"path": "/etc/hostname"}, headers={"Host": "evil.example", "E2b-Sandbox-Id": "x"})
        assert r.status_code in (403, 421), r.text


def test_the_tokenless_server_serves_ipv6_loopback_names() -> None:
    from sandrl.sandbox.service.auth import loopback_host

    for host in ("[::1]", "[::1]:8700", "localhost", "127.0.0.1:1", "127.255.0.1"):
        assert loopback_host(host), host
    for host in ("[::2]", "evil.example", "localhost.evil.example", "127.0.0.1.evil", "", "[::1", "0.0.0.0"):
        assert not loopback_host(host), host


def test_half_sent_headers_are_dropped(bwrap: BwrapProvider) -> None:
    """Slowloris: connections that never finish their headers must not be held."""
    with serving(bwrap, header_timeout_s=1) as s:
        idle = raw.connect(s.url)
        partial = raw.connect(s.url)
        partial.sendall(b"GET /healthz HT")
        trickle = raw.connect(s.url)
        trickle.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        try:
            for sock in (idle, partial, trickle):
                assert raw.closed_within(sock, 5), "the server held a connection with unfinished headers"
            # A keep-alive connection's second request is timed too.
            with socket.create_connection(("127.0.0.1", int(s.url.rsplit(":", 1)[1]))) as again:
                again.sendall(raw.head("GET", "/healthz", s.url, {}))
                assert again.recv(65536).startswith(b"HTTP/1.1 200")
                again.sendall(b"GET /healthz HTTP/1.1\r\n")
                assert raw.closed_within(again, 5)
        finally:
            for sock in (idle, partial, trickle):
                sock.close()
