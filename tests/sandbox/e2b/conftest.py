"""Fixtures for the E2B-compatible API: a real sandbox server, and the official SDK pointed at it.

The SDK is configured only as its users configure it: ``E2B_API_URL`` and ``E2B_SANDBOX_URL``
at the one server, ``E2B_API_KEY`` its token.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.sandbox.service.server import BackgroundServer, create_app
from sandrl.sandbox.service.state import SandboxService, ServiceConfig

from ...support import REASON

TOKEN = secrets.token_hex(24)


@dataclass
class E2BServer:
    url: str
    token: str
    service: SandboxService


@pytest.fixture(scope="session")
def e2b_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2BServer]:
    if REASON is not None:
        pytest.skip(REASON)
    provider = BwrapProvider(tmp_path_factory.mktemp("sandrl-e2b-state"))
    service = SandboxService(provider, ServiceConfig(max_live=100))
    try:
        with BackgroundServer(create_app(service, token=TOKEN)) as server, pytest.MonkeyPatch.context() as env:
            env.setenv("E2B_API_URL", server.url)
            env.setenv("E2B_SANDBOX_URL", server.url)
            env.setenv("E2B_API_KEY", TOKEN)
            env.delenv("E2B_DEBUG", raising=False)
            env.delenv("E2B_DOMAIN", raising=False)
            yield E2BServer(server.url, TOKEN, service)
    finally:
        provider._close_all_sync()
