"""Every native route over real HTTP, through the client and raw: results, errors, files, streaming."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import tarfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from sandrl.errors import (
    ConfigError,
    ImageNotFoundError,
    InvalidSpecError,
    SandboxFileError,
    SandboxNotFoundError,
)
from sandrl.sandbox.base import DEFAULT_OUTPUT_CAP, ExecResult, OutputChunk, Sandbox, SandboxProvider, SandboxSpec
from sandrl.sandbox.remote.provider import RemoteProvider, RemoteSandbox

from ...support import needs_sandbox
from .conftest import Served

pytestmark = needs_sandbox


async def test_remote_provider_is_a_sandbox_provider(remote: RemoteProvider, remote_sandbox: RemoteSandbox) -> None:
    assert isinstance(remote, SandboxProvider)
    assert isinstance(remote_sandbox, Sandbox)


async def test_create_get_list_delete(remote: RemoteProvider, served: Served) -> None:
    tag = uuid.uuid4().hex
    a = await remote.create(SandboxSpec(memory_mb=512, ttl_s=120), metadata={"run": tag, "role": "a"})
    b = await remote.create(SandboxSpec(ttl_s=120), metadata={"run": tag, "role": "b"})
    try:
        info = await remote.get(a.id)
        assert info.spec.memory_mb == 512 and info.metadata == {"run": tag, "role": "a"}
        assert 100 < info.expires_at - time.time() <= 120
        assert {s.id for s in await remote.list_sandboxes({"run": tag})} == {a.id, b.id}
        assert [s.id for s in await remote.list_sandboxes({"run": tag, "role": "b"})] == [b.id]
        assert a.id in served.service.entries
    finally:
        await a.close()
        await b.close()
    assert a.id not in served.service.entries and all(s is not a.id for s in served.provider.live)
    with pytest.raises(SandboxNotFoundError, match="deleted") as err:
        await remote.get(a.id)
    assert err.value.http_status == 404
    assert await remote.kill(a.id) is False
    await a.close()  # idempotent


async def test_exec_result_cwd_env_stdin_and_failure(remote_sandbox: RemoteSandbox) -> None:
    r = await remote_sandbox.exec("echo out; echo err >&2; exit 3")
    assert (r.exit_code, r.stdout, r.stderr, r.timed_out) == (3, "out\n", "err\n", False)
    r = await remote_sandbox.exec("pwd; echo $FOO", cwd="/tmp", env={"FOO": "bar"})
    assert r.stdout == "/tmp\nbar\n"
    r = await remote_sandbox.exec("wc -c", stdin=bytes(range(256)) * 10)
    assert r.stdout.strip() == "2560"


async def test_exec_timeout_is_a_result(remote_sandbox: RemoteSandbox) -> None:
    r = await remote_sandbox.exec("sleep 30", timeout_s=0.5)
    assert r.timed_out and r.exit_code == 124 and r.duration_s < 5


async def test_streaming_exec_sends_output_before_the_end(remote_sandbox: RemoteSandbox) -> None:
    seen: list[tuple[float, OutputChunk | ExecResult]] = []
    async for item in remote_sandbox.exec_stream("echo first; sleep 1; echo second >&2; printf 'é'; exit 4"):
        seen.append((time.monotonic(), item))
    chunks = [i for _, i in seen if isinstance(i, OutputChunk)]
    result = seen[-1][1]
    assert isinstance(result, ExecResult) and result.exit_code == 4
    assert chunks[0] == OutputChunk("stdout", b"first\n")
    assert seen[-1][0] - seen[0][0] > 0.8  # the first chunk came a second before the exit
    assert b"".join(c.data for c in chunks if c.stream == "stdout") == b"first\n\xc3\xa9"
    assert b"".join(c.data for c in chunks if c.stream == "stderr") == b"second\n"


async def test_streaming_exec_killed_when_the_client_leaves(remote_sandbox: RemoteSandbox) -> None:
    stream = remote_sandbox.exec_stream("echo go; sleep 97")
    async for item in stream:
        assert item == OutputChunk("stdout", b"go\n")
        break
    await stream.aclose()
    for _ in range(50):
        if "sleep 97" not in (await remote_sandbox.exec("ps -eo args")).stdout:
            break
        await asyncio.sleep(0.1)
    assert "sleep 97" not in (await remote_sandbox.exec("ps -eo args")).stdout


async def test_files_round_trip_binary_and_mode(remote_sandbox: RemoteSandbox) -> None:
    data = bytes(range(256)) * 1000
    await remote_sandbox.write_file("deep/dir/f.bin", data, mode=0o755)
    assert await remote_sandbox.read_file("/workspace/deep/dir/f.bin") == data
    r = await remote_sandbox.exec("stat -c %a deep/dir/f.bin; sha256sum deep/dir/f.bin")
    assert r.stdout.split()[:2] == ["755", hashlib.sha256(data).hexdigest()]
    await remote_sandbox.write_file("empty", b"")
    assert await remote_sandbox.read_file("empty") == b""


async def test_missing_file_is_404_file_not_found(remote_sandbox: RemoteSandbox) -> None:
    with pytest.raises(SandboxFileError) as err:
        await remote_sandbox.read_file("/nope/missing")
    assert err.value.error_code == "file_not_found" and err.value.http_status == 404


async def test_tar_upload_and_download(remote_sandbox: RemoteSandbox) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, body in (("a.txt", b"alpha"), ("sub/b.txt", b"beta" * 10000)):
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    await remote_sandbox.upload_tar("/srv/project", buf.getvalue())
    assert (await remote_sandbox.exec("cat /srv/project/a.txt")).stdout == "alpha"
    archive = b"".join([c async for c in remote_sandbox.download_tar("/srv/project")])
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        names = {m.name.removeprefix("./") for m in tar.getmembers() if m.isfile()}
        assert names == {"a.txt", "sub/b.txt"}
        member = tar.extractfile("./sub/b.txt")
        assert member is not None and member.read() == b"beta" * 10000
    with pytest.raises(SandboxFileError) as err:
        [c async for c in remote_sandbox.download_tar("/no/such/dir")]
    assert err.value.http_status == 404
    with pytest.raises(SandboxFileError, match="cannot unpack"):
        await remote_sandbox.upload_tar("/srv/x", b"this is not a tar archive" * 40)


async def test_file_paths_resolve_inside_the_sandbox(remote_sandbox: RemoteSandbox, tmp_path: Path) -> None:
    secret = tmp_path / "host-secret"
    secret.write_text("host only")
    marker = f"/tmp/sandrl-escape-{uuid.uuid4().hex}"
    # Writes through .. land in the sandbox's own root, never on the host.
    await remote_sandbox.write_file("../../../../.." + marker, b"inside")
    assert not Path(marker).exists()
    assert (await remote_sandbox.exec(f"cat {marker}")).stdout == "inside"
    # Host files are out of reach by absolute path, by .., and through symlinks made inside.
    for path in (str(secret), "../../../.." + str(secret)):
        with pytest.raises(SandboxFileError):
            await remote_sandbox.read_file(path)
    await remote_sandbox.exec(f"ln -s {secret} /workspace/link")
    with pytest.raises(SandboxFileError):
        await remote_sandbox.read_file("link")
    await remote_sandbox.exec("echo mine > /workspace/mark")
    await remote_sandbox.exec("ln -s /proc/1/root/workspace/mark /workspace/l2")
    assert await remote_sandbox.read_file("l2") == b"mine\n"  # pid 1 is the sandbox's own agent, its root the sandbox's
    with contextlib.suppress(SandboxFileError):  # the link's target does not exist in the sandbox
        await remote_sandbox.write_file("link", b"overwrote")
    assert secret.read_text() == "host only"


@pytest.mark.slow
async def test_one_gib_file_streams_both_ways(remote: RemoteProvider, served: Served) -> None:
    import resource

    size, block = 1 << 30, bytes(range(256)) * 4096  # 1 MiB
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(size // len(block)):
            yield i.to_bytes(8, "little") + block[8:]

    async with await remote.create(SandboxSpec(memory_mb=3072, disk_mb=2048, ttl_s=300)) as sb:
        expected = hashlib.sha256()
        async for c in chunks():
            expected.update(c)
        assert await sb.write_file_stream("big.bin", chunks()) == size
        assert (await sb.exec("sha256sum big.bin", timeout_s=120)).stdout.split()[0] == expected.hexdigest()
        got, n = hashlib.sha256(), 0
        async for c in sb.read_file_stream("big.bin", max_bytes=size):
            got.update(c)
            n += len(c)
        assert n == size and got.hexdigest() == expected.hexdigest()
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    assert grown_mib < 300, f"the server and client grew by {grown_mib:.0f} MiB moving 1 GiB: something buffered it"


async def test_typed_errors_for_bad_specs(remote: RemoteProvider) -> None:
    with pytest.raises(ImageNotFoundError):
        await remote.create(SandboxSpec(image="no-such-image"))
    with pytest.raises(InvalidSpecError, match="maximum"):
        await remote.create(SandboxSpec(ttl_s=10**7))


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status", "code"),
    [
        (
            "POST",
            "/v1/sandboxes",
            {"content": b"{not json", "headers": {"content-type": "application/json"}},
            400,
            "invalid_spec",
        ),
        ("POST", "/v1/sandboxes", {"json": {"memory_mb": "lots"}}, 400, "invalid_spec"),
        ("POST", "/v1/sandboxes", {"json": {"cpus": 0}}, 400, "invalid_spec"),
        ("POST", "/v1/sandboxes", {"json": {"surprise": 1}}, 400, "invalid_spec"),
        ("POST", "/v1/sandboxes", {"json": [1, 2]}, 400, "invalid_spec"),
        ("POST", "/v1/sandboxes/sb-nope/exec", {"json": {"command": "true"}}, 404, "sandbox_not_found"),
        ("POST", "/v1/sandboxes/sb-nope/exec", {"json": {}}, 400, "invalid_request"),
        ("GET", "/v1/sandboxes/sb-nope", {}, 404, "sandbox_not_found"),
        ("GET", "/v1/sandboxes/..%2F..%2Fetc", {}, 404, "not_found"),
        ("GET", "/v1/sandboxes?metadata=novalue", {}, 400, "invalid_request"),
        ("GET", "/v1/nothing", {}, 404, "not_found"),
        ("PATCH", "/v1/sandboxes", {}, 405, "method_not_allowed"),
        (
            "POST",
            "/v1/sandboxes",
            {"content": b"x" * (17 << 20), "headers": {"content-type": "application/json"}},
            413,
            "payload_too_large",
        ),
    ],
)
async def test_malformed_requests_get_clear_4xx(
    http: httpx.AsyncClient, method: str, path: str, kwargs: dict[str, object], status: int, code: str
) -> None:
    r = await http.request(method, path, **kwargs)  # type: ignore[arg-type]
    assert r.status_code == status, r.text
    body = r.json()
    assert body["code"] == status and body["error_code"] == code and len(body["message"]) > 10
    assert (await http.get("/healthz")).status_code == 200


async def test_chunked_oversized_body_is_413(http: httpx.AsyncClient) -> None:
    async def body() -> AsyncIterator[bytes]:
        for _ in range(20):
            yield b"x" * (1 << 20)

    r = await http.post("/v1/sandboxes", content=body(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error_code"] == "payload_too_large"


async def test_bad_exec_input_is_4xx(http: httpx.AsyncClient, remote_sandbox: RemoteSandbox) -> None:
    url = f"/v1/sandboxes/{remote_sandbox.id}/exec"
    for body, code in (
        ({"command": "echo \u0000"}, "invalid_request"),
        ({"command": "true", "stdin_b64": "***"}, "invalid_request"),
        ({"command": "true", "env": {"1BAD": "x"}}, "invalid_spec"),
        ({"command": "true", "timeout_s": -1}, "invalid_request"),
    ):
        r = await http.post(url, json=body)
        assert r.status_code == 400 and r.json()["error_code"] == code, r.text
    r = await http.put(f"/v1/sandboxes/{remote_sandbox.id}/files", params={"path": "a", "mode": "999"}, content=b"x")
    assert r.status_code == 400


async def test_metrics_count_creates_execs_and_failures(http: httpx.AsyncClient, remote_sandbox: RemoteSandbox) -> None:
    await remote_sandbox.exec("true")
    await http.get("/v1/sandboxes/sb-missing")
    text = (await http.get("/metrics")).text
    for name in (
        "sandrl_sandboxes_live ",
        "sandrl_sandbox_creates_total ",
        "sandrl_sandbox_create_seconds_bucket",
        "sandrl_exec_seconds_count ",
        'sandrl_failures_total{error_code="sandbox_not_found"}',
        "sandrl_host_memory_available_bytes ",
    ):
        assert name in text, name
    live = next(line for line in text.splitlines() if line.startswith("sandrl_sandboxes_live "))
    assert float(live.split()[1]) >= 1


async def test_openapi_document_lists_every_route(http: httpx.AsyncClient) -> None:
    doc = (await http.get("/openapi.json")).json()
    assert {
        "/v1/sandboxes",
        "/v1/sandboxes/{sandbox_id}",
        "/v1/sandboxes/{sandbox_id}/timeout",
        "/v1/sandboxes/{sandbox_id}/exec",
        "/v1/sandboxes/{sandbox_id}/exec/stream",
        "/v1/sandboxes/{sandbox_id}/files",
        "/v1/sandboxes/{sandbox_id}/tar",
        "/healthz",
        "/metrics",
    } <= set(doc["paths"])
    assert set(doc["paths"]["/v1/sandboxes/{sandbox_id}/files"]) == {"get", "put"}
    assert "HTTPBearer" in doc["components"]["securitySchemes"]
    assert "ErrorBody" in doc["components"]["schemas"]


async def test_unknown_error_codes_keep_their_status(remote: RemoteProvider) -> None:
    with pytest.raises(ConfigError) as err:
        await remote.request("GET", "/nothing")
    assert err.value.error_code == "not_found" and err.value.http_status == 404
    with pytest.raises(ConfigError) as err:  # the same through the lean path of calls held in memory
        await remote.call("GET", "/nothing")
    assert err.value.error_code == "not_found" and err.value.http_status == 404


async def test_a_flood_of_output_reaches_the_client_bounded(remote_sandbox: RemoteSandbox) -> None:
    """Output is sandbox content: 64 MiB printed reaches the client (whose lean path reads an answer
    whole) cut to the per-stream cap, marked truncated, the sandbox still answering."""
    r = await remote_sandbox.exec("head -c 67108864 /dev/zero | tr '\\0' x; echo done >&2", timeout_s=60)
    assert r.truncated and 0 < len(r.stdout) <= DEFAULT_OUTPUT_CAP and set(r.stdout) == {"x"}
    assert r.stderr == "done\n" and r.exit_code == 0
    assert (await remote_sandbox.exec("echo alive")).stdout == "alive\n"


async def test_an_id_from_the_caller_cannot_forge_the_request(
    remote: RemoteProvider, remote_sandbox: RemoteSandbox
) -> None:
    """The lean path writes its request head itself: a sandbox id with spaces, CR/LF or ``?`` is quoted
    into the path, never read as the end of the line, a header or a query."""
    for forged in (
        f"{remote_sandbox.id}\r\nX-Evil: 1",
        f"{remote_sandbox.id} HTTP/1.1",
        f"{remote_sandbox.id}?x=1",
        "../healthz",
    ):
        with pytest.raises((ConfigError, SandboxNotFoundError)) as err:
            await remote.get(forged)
        assert err.value.http_status in (400, 404), err.value  # the server read one request and named what was wrong
    assert (await remote.get(remote_sandbox.id)).id == remote_sandbox.id  # the connection is still in step


async def test_hot_routes_answer_as_fastapi_does(http: httpx.AsyncClient, remote_sandbox: RemoteSandbox) -> None:
    """create, exec and delete are served by the lean dispatch (service.hot_routes) for an ``application/json``
    body, by FastAPI for any other: the answers are the same but for the ids and times in them."""

    def wire(r: httpx.Response) -> tuple[int, str | None, str | None, object]:
        body: object = r.json() if r.content else None
        length = r.headers.get("content-length")
        if isinstance(body, dict) and body.keys() & varying:
            body, length = {k: v for k, v in body.items() if k not in varying}, "(varies)"
        return r.status_code, r.headers.get("content-type"), length, body

    varying = {"id", "created_at", "expires_at", "duration_s"}

    hot = {"content-type": "application/json"}
    routed = {"content-type": "application/json; charset=utf-8"}  # not taken by the lean dispatch
    exec_path = f"/v1/sandboxes/{remote_sandbox.id}/exec"
    cases: list[tuple[str, str, bytes]] = [
        ("POST", exec_path, b'{"command": "echo hi; echo err >&2; exit 3"}'),
        ("POST", exec_path, b'{"command": "true", "stdin_b64": "***"}'),
        ("POST", "/v1/sandboxes/sb-nope/exec", b'{"command": "true"}'),
        ("POST", "/v1/sandboxes", b'{"ttl_s": 10000000}'),
        ("DELETE", "/v1/sandboxes/sb-nope", b""),
    ]
    for method, path, content in cases:
        a = await http.request(method, path, content=content, headers=hot)
        b = await http.request(method, path, content=content, headers=routed)
        assert wire(a) == wire(b), (method, path)
    made = [await http.post("/v1/sandboxes", content=b'{"ttl_s": 60}', headers=h) for h in (hot, routed)]
    assert wire(made[0]) == wire(made[1]) and made[0].status_code == 201
    gone = [
        await http.delete(f"/v1/sandboxes/{r.json()['id']}", headers=h)
        for r, h in zip(made, (hot, routed), strict=True)
    ]
    assert wire(gone[0]) == wire(gone[1]) and gone[0].status_code == 204
