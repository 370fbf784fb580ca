"""Schemathesis against the served OpenAPI document: generated requests, valid and not, never get a 5xx."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.sandbox.service.server import create_app
from sandrl.sandbox.service.state import SandboxService, ServiceConfig

from ...support import needs_sandbox
from .conftest import Served, serving

pytestmark = needs_sandbox


class _NoProvider:
    async def create(self, spec: Any) -> Any:
        raise AssertionError("only the OpenAPI document is read from this app")


schemathesis.serializer.alias("application/x-tar", "application/octet-stream")
# The document as the app generates it; test_served_document_is_this_one checks the server serves the same.
DOCUMENT = create_app(SandboxService(_NoProvider()), token=None).openapi()
schema = schemathesis.openapi.from_dict(DOCUMENT)


@pytest.fixture(scope="module")
def fuzzed(bwrap: BwrapProvider) -> Iterator[Served]:
    config = ServiceConfig(max_live=3, max_create_wait_s=0.2, max_ttl_s=600, exec_grace_s=2)
    with serving(bwrap, config) as s:
        yield s


def test_served_document_is_this_one(fuzzed: Served) -> None:
    import httpx

    served = httpx.get(fuzzed.url + "/openapi.json", headers={"Authorization": f"Bearer {fuzzed.token}"}).json()
    assert served == DOCUMENT


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_request_gets_a_server_error(case: schemathesis.Case, fuzzed: Served) -> None:
    if case.path == "/v1/sandboxes/{sandbox_id}/exec" or case.path.endswith("/exec/stream"):
        body = case.body if isinstance(case.body, dict) else None
        if body is not None:  # bounded: a generated command may well be `sleep`
            body["timeout_s"] = min(float(body.get("timeout_s", 1) or 1), 2.0) if _number(body.get("timeout_s")) else 1
    response = case.call(base_url=fuzzed.url, headers={"Authorization": f"Bearer {fuzzed.token}"}, timeout=30)
    case.validate_response(response, checks=[not_a_server_error])


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def test_zz_fuzzing_left_the_server_up(fuzzed: Served) -> None:
    import httpx

    assert httpx.get(fuzzed.url + "/healthz").status_code == 200
    assert fuzzed.service.loop is not None
    asyncio.run_coroutine_threadsafe(_close_all(fuzzed.service), fuzzed.service.loop).result(30)
    assert not fuzzed.service.entries


async def _close_all(service: SandboxService) -> None:
    for entry in list(service.entries.values()):
        await service.delete(entry)
