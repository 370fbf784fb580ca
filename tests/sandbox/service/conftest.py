"""Fixtures for the sandbox service tests: a real server (uvicorn on 127.0.0.1) over real bwrap sandboxes."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.sandbox.remote.config import ClientConfig
from sandrl.sandbox.remote.provider import RemoteProvider, RemoteSandbox
from sandrl.sandbox.service.server import BackgroundServer, create_app
from sandrl.sandbox.service.state import SandboxService, ServiceConfig

from ...support import REASON

TOKEN = secrets.token_hex(24)


@dataclass
class Served:
    url: str
    service: SandboxService
    provider: BwrapProvider
    token: str | None
    server: BackgroundServer


@pytest.fixture(scope="session")
def service_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sandrl-service-state")


@pytest.fixture(scope="session")
def bwrap(service_state_dir: Path) -> Iterator[BwrapProvider]:
    if REASON is not None:
        pytest.skip(REASON)
    p = BwrapProvider(service_state_dir)
    yield p
    p._close_all_sync()


@contextmanager
def serving(
    provider: BwrapProvider,
    config: ServiceConfig | None = None,
    token: str | None = TOKEN,
    *,
    header_timeout_s: float | None = None,
) -> Iterator[Served]:
    """A service over ``provider`` on a free port; every sandbox it made is closed when it stops."""
    service = SandboxService(provider, config or ServiceConfig(max_live=300))
    options = {} if header_timeout_s is None else {"header_timeout_s": header_timeout_s}
    with BackgroundServer(create_app(service, token=token), **options) as server:
        yield Served(server.url, service, provider, token, server)


@pytest.fixture(scope="session")
def served(bwrap: BwrapProvider) -> Iterator[Served]:
    with serving(bwrap) as s:
        yield s


@pytest.fixture
async def http(served: Served) -> AsyncIterator[httpx.AsyncClient]:
    """The service's native API with the token, for raw HTTP requests (test_hostile has a sync one of its own)."""
    headers = {"Authorization": f"Bearer {served.token}"}
    async with httpx.AsyncClient(base_url=served.url, headers=headers, timeout=60) as client:
        yield client


@pytest.fixture
async def remote(served: Served) -> AsyncIterator[RemoteProvider]:
    async with RemoteProvider(served.url, token=served.token, config=ClientConfig(retries=1)) as provider:
        yield provider


@pytest.fixture
async def remote_sandbox(remote: RemoteProvider) -> AsyncIterator[RemoteSandbox]:
    """A sandbox of the service, through the client; closed after the test."""
    sb = await remote.create(SandboxSpec(ttl_s=300))
    try:
        yield sb
    finally:
        await sb.close()
