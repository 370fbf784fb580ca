"""The remote client's retry policy, try by try: what is sent again, how often, and the typed error after.

The service is a handler at the transport (no socket), so each test counts the tries it saw.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from sandrl.errors import SandboxError, SandboxNotFoundError, SandboxUnavailableError
from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.remote.config import ClientConfig
from sandrl.sandbox.remote.provider import RemoteProvider

HEALTH = {"status": "ok", "live": 0, "version": "test"}


Answer = Callable[[httpx.Request, int], httpx.Response]


def provider(answer: Answer, retries: int = 3) -> tuple[RemoteProvider, list[str]]:
    """A provider whose every request is answered by ``answer(request, try number)``; the tries' methods are logged."""
    seen: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.method)
        return answer(request, len(seen))

    config = ClientConfig(retries=retries, backoff_s=0.001, backoff_max_s=0.002)
    transport = httpx.MockTransport(handle)
    return RemoteProvider("http://sandboxes.test", token="t", config=config, transport=transport), seen


def busy(request: httpx.Request, n: int) -> httpx.Response:
    return httpx.Response(503, json={"code": 503, "error_code": "service_draining", "message": "draining"})


async def test_an_idempotent_call_answered_503_is_sent_again_until_it_passes() -> None:
    remote, seen = provider(lambda r, n: busy(r, n) if n < 3 else httpx.Response(200, json=HEALTH))
    assert (await remote.health()).status == "ok"
    assert seen == ["GET"] * 3


async def test_an_idempotent_call_answered_503_each_time_raises_the_servers_error_after_every_retry() -> None:
    remote, seen = provider(busy, retries=2)
    with pytest.raises(SandboxUnavailableError) as err:
        await remote.health()
    assert err.value.error_code == "service_draining" and err.value.http_status == 503
    assert seen == ["GET"] * 3


async def test_a_create_answered_503_is_not_sent_again() -> None:
    remote, seen = provider(busy)
    with pytest.raises(SandboxUnavailableError) as err:
        await remote.create(SandboxSpec())
    assert err.value.error_code == "service_draining"
    assert seen == ["POST"]


async def test_an_error_answer_is_not_retried() -> None:
    not_found = {"code": 404, "error_code": "sandbox_not_found", "message": "no sandbox x"}
    remote, seen = provider(lambda r, n: httpx.Response(404, json=not_found))
    with pytest.raises(SandboxNotFoundError):
        await remote.get("x")
    assert seen == ["GET"]


async def test_an_unreachable_server_is_tried_again_then_named_with_the_count_of_tries() -> None:
    def refuse(request: httpx.Request, n: int) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    remote, seen = provider(refuse, retries=3)
    with pytest.raises(SandboxUnavailableError) as err:
        await remote.create(SandboxSpec())  # even a create: the request never arrived
    assert err.value.error_code == "service_unreachable"
    assert "4 attempts" in str(err.value) and "sandrl serve sandboxes" in str(err.value)
    assert seen == ["POST"] * 4


async def test_a_broken_connection_retries_an_idempotent_call_but_not_one_that_may_have_run() -> None:
    def broken_once(request: httpx.Request, n: int) -> httpx.Response:
        if n == 1:
            raise httpx.ReadError("connection reset", request=request)
        return httpx.Response(200, json=HEALTH)

    remote, seen = provider(broken_once)
    assert (await remote.health()).status == "ok"
    assert seen == ["GET", "GET"]

    remote, seen = provider(broken_once)
    with pytest.raises(SandboxUnavailableError) as err:
        await remote.create(SandboxSpec())
    assert err.value.error_code == "service_connection_lost"
    assert "may or may not have run" in str(err.value)
    assert seen == ["POST"]


async def test_a_timeout_is_not_retried() -> None:
    def slow(request: httpx.Request, n: int) -> httpx.Response:
        raise httpx.ReadTimeout("no answer", request=request)

    remote, seen = provider(slow)
    with pytest.raises(SandboxError) as err:
        await remote.health()
    assert err.value.error_code == "service_timeout"
    assert seen == ["GET"]
