"""Issue #18 over the service's API: a client's reads stay bounded against a server that streams without
end, and the crash of a sandbox keeps its meaning on the wire."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import httpx
import pytest

from sandrl.errors import SandboxClosedError, SandboxCrashedError, SandboxFileTooLargeError, SandrlError
from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.remote.provider import RemoteProvider, RemoteSandbox
from sandrl.sandbox.remote.wire import SandboxInfo


class EndlessFiles:
    """A sandbox service whose every file is endless (what a link to /dev/zero is without a bound)."""

    def __init__(self) -> None:
        self.sent = 0

    async def _zeros(self) -> AsyncIterator[bytes]:
        while True:
            self.sent += 1 << 16
            yield bytes(1 << 16)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET" and request.url.path.endswith("/files"):
            return httpx.Response(200, content=self._zeros())
        return httpx.Response(404, json={"code": 404, "error_code": "sandbox_not_found", "message": "no"})


def remote_sandbox(handler: httpx.AsyncBaseTransport) -> RemoteSandbox:
    provider = RemoteProvider("http://sandboxes.test", transport=handler, token="t")
    now = time.time()
    info = SandboxInfo.model_validate(
        {"id": "sb-1", "spec": SandboxSpec().to_dict(), "metadata": {}, "created_at": now, "expires_at": now + 60}
    )
    return RemoteSandbox(provider, info)


async def test_a_remote_read_stops_at_its_bound_whatever_the_server_sends() -> None:
    server = EndlessFiles()
    sandbox = remote_sandbox(httpx.MockTransport(server.handle))
    try:
        with pytest.raises(SandboxFileTooLargeError) as info:
            await sandbox.read_file("/workspace/answer.txt", max_bytes=1 << 20)
        assert "larger than 1048576 bytes" in str(info.value)
        assert server.sent <= (1 << 20) + (1 << 17)  # the transfer was dropped at the bound

        server.sent = 0
        total = 0
        with pytest.raises(SandboxFileTooLargeError):
            async for chunk in sandbox.read_file_stream("/workspace/answer.txt", max_bytes=5 << 20):
                total += len(chunk)
        assert total <= 5 << 20
    finally:
        await sandbox.provider.aclose()


@pytest.mark.parametrize(
    ("error_code", "crashed"),
    [("sandbox_crashed", True), ("sandbox_closed", False)],
)
async def test_a_crash_the_sandbox_caused_keeps_its_class_over_the_wire(error_code: str, crashed: bool) -> None:
    async def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(410, json={"code": 410, "error_code": error_code, "message": "sandbox sb-1 crashed"})

    sandbox = remote_sandbox(httpx.MockTransport(handle))
    try:
        with pytest.raises(SandrlError) as info:
            await sandbox.exec("true")
    finally:
        await sandbox.provider.aclose()
    assert isinstance(info.value, SandboxClosedError)
    assert isinstance(info.value, SandboxCrashedError) is crashed
    if crashed:
        assert isinstance(info.value, SandboxCrashedError) and info.value.caused_by_sandbox


def test_a_crash_the_sandbox_did_not_cause_travels_as_closed() -> None:
    # The service sends a crash's error_code: one the sandbox did not cause must read as an ordinary close.
    assert SandboxCrashedError("x", caused_by_sandbox=False).error_code == "sandbox_closed"
    assert SandboxCrashedError("x", caused_by_sandbox=True).error_code == "sandbox_crashed"
