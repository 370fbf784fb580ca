"""Hostile envd traffic (security issue #18): uploads over the sandbox's disk, gzip bombs,
bodies sent before the token is checked, and probing which sandbox ids exist."""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Iterator

import httpx
import pytest

from ..service import raw
from .conftest import E2BServer

MiB = 1 << 20
ENVD = {"E2b-Sandbox-Port": "49983"}


@pytest.fixture
def small_disk(e2b_server: E2BServer) -> Iterator[tuple[str, str]]:
    """A sandbox with a 16 MiB disk (made through /v1, which takes disk_mb) and its envd access token."""
    bearer = {"Authorization": f"Bearer {e2b_server.token}"}
    r = httpx.post(e2b_server.url + "/v1/sandboxes", json={"disk_mb": 16, "ttl_s": 300}, headers=bearer, timeout=60)
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    info = httpx.get(f"{e2b_server.url}/sandboxes/{sid}", headers={"X-API-Key": e2b_server.token}, timeout=30)
    yield sid, info.json()["envdAccessToken"]
    httpx.delete(f"{e2b_server.url}/v1/sandboxes/{sid}", headers=bearer, timeout=30)


def _multipart(boundary: str, name: str, n_mib: int) -> Iterator[bytes]:
    yield (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    block = os.urandom(MiB)
    for _ in range(n_mib):
        yield block
    yield f"\r\n--{boundary}--\r\n".encode()


@pytest.mark.parametrize("kind", ["multipart", "octet-stream"])
@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_envd_upload_over_the_sandbox_disk_is_cut_before_it_reaches_the_host(
    e2b_server: E2BServer, small_disk: tuple[str, str], kind: str, declared: bool
) -> None:
    """200 MiB into a 16 MiB sandbox: not spooled to the server's /tmp, not read past the disk's size."""
    sid, token = small_disk
    size = 200
    headers = ENVD | {"E2b-Sandbox-Id": sid, "X-Access-Token": token}
    if kind == "multipart":
        boundary = "sandrl-test-boundary"
        headers["Content-Type"] = f"multipart/form-data; boundary={boundary}"
        body = _multipart(boundary, "/tmp/big.bin", size)
        length = sum(len(c) for c in _multipart(boundary, "/tmp/big.bin", 0)) + size * MiB
    else:
        headers["Content-Type"] = "application/octet-stream"
        body = (os.urandom(MiB) for _ in range(size))
        length = size * MiB
    if declared:
        headers["Content-Length"] = str(length)
    answer = raw.request(e2b_server.url, "POST", "/files?path=/tmp/big.bin", headers, body, chunked=not declared)
    assert answer.status in (413, 507), answer.body
    assert "disk" in answer.json()["message"]
    assert answer.sent < (0 if declared else 16 * MiB) + 24 * MiB, f"the server read {answer.sent >> 20} MiB"


def test_envd_gzip_upload_inflates_no_further_than_the_sandbox_disk(
    e2b_server: E2BServer, small_disk: tuple[str, str]
) -> None:
    """A gzip bomb (256 MiB of zeros in ~256 KiB) is stopped once it inflates past the disk."""
    sid, token = small_disk
    bomb = gzip.compress(bytes(256 * MiB), compresslevel=9)
    headers = ENVD | {
        "E2b-Sandbox-Id": sid,
        "X-Access-Token": token,
        "Content-Type": "application/octet-stream",
        "Content-Encoding": "gzip",
    }
    small = zlib.compress(b"hello", wbits=31)
    r = httpx.post(e2b_server.url + "/files", params={"path": "/tmp/ok"}, content=small, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    r = httpx.post(e2b_server.url + "/files", params={"path": "/tmp/bomb"}, content=bomb, headers=headers, timeout=60)
    assert r.status_code == 413, r.text
    assert "inflate" in r.json()["message"] and "disk" in r.json()["message"]


@pytest.mark.parametrize(
    ("path", "content_type"),
    [
        ("/process.Process/List", "application/json"),
        ("/process.Process/Start", "application/connect+json"),
        ("/filesystem.Filesystem/Stat", "application/proto"),
        ("/files?path=/tmp/x", "application/octet-stream"),
    ],
)
def test_envd_checks_the_token_before_reading_a_body(
    e2b_server: E2BServer, small_disk: tuple[str, str], path: str, content_type: str
) -> None:
    """A 4 MiB body announced with a wrong token is refused at once, without the server waiting for it."""
    sid, _ = small_disk
    headers = ENVD | {
        "E2b-Sandbox-Id": sid,
        "X-Access-Token": "wrong",
        "Content-Type": content_type,
        "Content-Length": str(4 * MiB),
    }
    answer = raw.request(e2b_server.url, "POST", path, headers, timeout_s=5)  # the body is never sent
    if content_type.startswith("application/connect+"):
        assert answer.status == 200 and b"unauthenticated" in answer.body  # Connect streams end with the error
    else:
        assert answer.status == 401, answer.body


def _refusal(
    e2b_server: E2BServer, sid: str, token: str, method: str, path: str, content_type: str
) -> tuple[int, bytes]:
    headers = ENVD | {"E2b-Sandbox-Id": sid, "X-Access-Token": token, "Content-Type": content_type}
    body = b"{}" if "json" in content_type else b""
    if content_type == "application/connect+json":
        body = b"\x00" + len(body).to_bytes(4, "big") + body
    r = httpx.request(method, e2b_server.url + path, content=body, headers=headers, timeout=30)
    return r.status_code, r.content


@pytest.mark.parametrize(
    ("method", "path", "content_type"),
    [
        ("GET", "/files?path=/etc/hostname", "application/octet-stream"),
        ("POST", "/files?path=/tmp/x", "application/octet-stream"),
        ("GET", "/health", "application/json"),
        ("POST", "/process.Process/List", "application/json"),
        ("POST", "/process.Process/Start", "application/connect+json"),
        ("POST", "/filesystem.Filesystem/ListDir", "application/json"),
    ],
)
def test_an_unknown_sandbox_is_answered_like_a_forbidden_one(
    e2b_server: E2BServer, small_disk: tuple[str, str], method: str, path: str, content_type: str
) -> None:
    """Without its token, nobody can tell a live sandbox id from one that never existed (or one made through /v1)."""
    sid, token = small_disk
    forbidden = _refusal(e2b_server, sid, "wrong", method, path, content_type)
    unknown = _refusal(e2b_server, "sb-never-existed", "wrong", method, path, content_type)
    assert forbidden == unknown
    assert forbidden[0] == 401 or (forbidden[0] == 200 and b"unauthenticated" in forbidden[1])
    assert _refusal(e2b_server, "sb-never-existed", token, method, path, content_type) == unknown
    # A sandbox never connected through E2B has no envd token: answered the same too.
    bearer = {"Authorization": f"Bearer {e2b_server.token}"}
    r = httpx.post(e2b_server.url + "/v1/sandboxes", json={"ttl_s": 60}, headers=bearer, timeout=60)
    other = r.json()["id"]
    try:
        assert _refusal(e2b_server, other, "wrong", method, path, content_type) == unknown
    finally:
        httpx.delete(f"{e2b_server.url}/v1/sandboxes/{other}", headers=bearer, timeout=30)
