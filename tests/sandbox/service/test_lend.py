"""A loan (``sandbox/service/lend.py``) lends a live sandbox's commands and files and nothing of its life:
over real HTTP to the loan's server, every route that would change the sandbox's TTL, pause, snapshot,
fork, close it or make others is refused, whatever the Python; and the loan ends with the sandbox as
it was lent."""

from __future__ import annotations

import io
import tarfile
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from sandrl.sandbox.base import Pausable, SandboxSpec, Snapshottable
from sandrl.sandbox.bwrap import BwrapProvider, BwrapSandbox
from sandrl.sandbox.service.lend import Lent, lend, lent
from sandrl.sandbox.service.state import StreamingSandbox

TTL_S = 300.0


@pytest.fixture
async def sandbox(bwrap: BwrapProvider) -> AsyncIterator[BwrapSandbox]:
    sb = await bwrap.create(SandboxSpec(ttl_s=TTL_S))
    try:
        yield sb
    finally:
        await sb.close()


def _tar(name: str, data: bytes) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


# Each route of the loan's server (native and E2B API) that is not commands, files or a look at the
# sandbox: the ones that reached the sandbox before (a TTL of 1 s, fork, snapshot, pause), and the rest.
REFUSED: list[tuple[str, str, dict[str, Any] | None]] = [
    ("POST", "/v1/sandboxes/{id}/timeout", {"ttl_s": 1}),
    ("DELETE", "/v1/sandboxes/{id}", None),
    ("POST", "/v1/sandboxes", {"ttl_s": 60}),
    ("GET", "/v1/channel", None),
    ("GET", "/metrics", None),
    ("POST", "/sandboxes/{id}/timeout", {"timeout": 1}),
    ("POST", "/sandboxes/{id}/refreshes", {"duration": 1}),
    ("POST", "/sandboxes/{id}/pause", None),
    ("POST", "/sandboxes/{id}/resume", {}),
    ("POST", "/sandboxes/{id}/connect", {"timeout": 1}),
    ("POST", "/sandboxes/{id}/snapshots", {"name": "lent-snapshot"}),
    ("POST", "/sandboxes/{id}/fork", {"count": 2, "timeout": 86000}),
    ("DELETE", "/sandboxes/{id}", None),
    ("POST", "/sandboxes", {"templateID": "host"}),
    ("GET", "/sandboxes/{id}/metrics", None),
    ("POST", "/v1/sandboxes/{id}/timeout/", {"ttl_s": 1}),
    ("POST", "/v1/sandboxes/{id}%2Ftimeout", {"ttl_s": 1}),
    ("POST", "/v1/sandboxes/{id}/exec%0A", {"command": "true"}),
    ("HEAD", "/v1/sandboxes/{id}", None),
]


async def test_the_loans_server_refuses_every_route_but_commands_and_files(
    sandbox: BwrapSandbox, bwrap: BwrapProvider
) -> None:
    expires_at = sandbox.expires_at
    live = len(bwrap.live)
    snapshots = sorted(p.name for p in (bwrap.images.root / "images").iterdir())
    async with lend(sandbox) as loan:
        headers = {"Authorization": f"Bearer {loan.token}", "X-API-Key": loan.token}
        async with httpx.AsyncClient(base_url=loan.url, headers=headers, timeout=60) as http:
            for method, route, body in REFUSED:
                r = await http.request(method, route.format(id=loan.sandbox_id), json=body)
                assert r.status_code == 403, (method, route, r.status_code, r.text)
                assert method == "HEAD" or r.json()["error_code"] == "not_lent", (method, route)
            # envd's API (a request carrying E2b-Sandbox-Id) is not lent either
            r = await http.post("/process.Process/Start", headers={"E2b-Sandbox-Id": loan.sandbox_id}, content=b"")
            assert r.status_code == 403 and r.json()["error_code"] == "not_lent"
            # what is lent still works
            base = f"/v1/sandboxes/{loan.sandbox_id}"
            assert (await http.get(base)).status_code == 200
            r = await http.post(base + "/exec", json={"command": "echo hi"})
            assert r.status_code == 200 and r.json()["stdout"] == "hi\n"
            r = await http.post(base + "/exec/stream", json={"command": "echo streamed"})
            assert r.status_code == 200 and "streamed" in r.text
            assert (await http.put(base + "/files", params={"path": "/tmp/a"}, content=b"A")).status_code == 200
            assert (await http.get(base + "/files", params={"path": "/tmp/a"})).content == b"A"
            r = await http.put(base + "/tar", params={"path": "/tmp/d"}, content=_tar("b", b"B"))
            assert r.status_code == 200, r.text
            assert (await http.get(base + "/tar", params={"path": "/tmp/d"})).status_code == 200
            # without the loan's token, nothing
            r = await http.post(base + "/exec", json={"command": "true"}, headers={"Authorization": "Bearer x"})
            assert r.status_code == 401
    assert not sandbox.closed and not sandbox.paused
    assert abs(sandbox.expires_at - expires_at) < 1.0
    assert len(bwrap.live) == live  # no fork, no new sandbox
    assert sorted(p.name for p in (bwrap.images.root / "images").iterdir()) == snapshots  # no snapshot
    assert (await sandbox.exec("cat /tmp/a /tmp/d/b")).stdout == "AB"


async def test_the_lent_sandbox_offers_no_life_cycle_on_any_python(sandbox: BwrapSandbox) -> None:
    held = lent(sandbox)
    assert isinstance(held, Lent) and isinstance(held, StreamingSandbox)  # commands and files, streamed
    assert not isinstance(held, Pausable) and not isinstance(held, Snapshottable)
    for name in ("pause", "resume", "paused", "snapshot", "fork", "set_ttl", "expires_at", "stats", "_sandbox"):
        assert not hasattr(held, name), name
    await held.close()  # the borrower's delete: the sandbox is the owner's to close
    assert not sandbox.closed and (await held.exec("echo ok")).stdout == "ok\n"


async def test_a_loan_ends_with_the_sandbox_as_it_was_lent(sandbox: BwrapSandbox) -> None:
    expires_at = sandbox.expires_at
    async with lend(sandbox):
        # as if the borrower had reached the sandbox some other way
        await sandbox.set_ttl(5)
        await sandbox.pause()
    assert not sandbox.paused
    assert abs(sandbox.expires_at - expires_at) < 1.0
    time.sleep(0.01)
    assert (await sandbox.exec("echo alive")).stdout == "alive\n"
