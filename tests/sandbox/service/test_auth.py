"""Bearer-token auth: refused without it, with a wrong one, or in a query string; where the token comes from."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from sandrl.errors import ConfigError
from sandrl.sandbox.remote.provider import RemoteProvider
from sandrl.sandbox.service.auth import bind_host, load_token

from ...support import needs_sandbox
from .conftest import TOKEN, Served


@pytest.fixture
async def anon(served: Served) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=served.url, timeout=30) as client:
        yield client


ROUTES = [
    ("GET", "/v1/sandboxes"),
    ("POST", "/v1/sandboxes/sb-x/exec"),
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
    ("DELETE", "/v1/sandboxes/sb-x"),
    ("GET", "/v1/sandboxes/sb-x/files?path=a"),
    ("GET", "/nothing"),
]


@needs_sandbox
@pytest.mark.parametrize(("method", "path"), ROUTES)
async def test_every_route_but_healthz_needs_the_token(anon: httpx.AsyncClient, method: str, path: str) -> None:
    for headers in (
        {},
        {"Authorization": "Bearer wrong-token-wrong-token"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": TOKEN},
    ):
        r = await anon.request(method, path, headers=headers, json={})
        assert r.status_code == 401, (headers, r.text)
        assert r.json()["error_code"] == "unauthorized" and "Bearer" in r.json()["message"]
        assert r.headers["www-authenticate"].startswith("Bearer")
    ok = await anon.request(method, path, headers={"Authorization": f"Bearer {TOKEN}"}, json={})
    assert ok.status_code != 401


@needs_sandbox
async def test_healthz_is_open(anon: httpx.AsyncClient) -> None:
    r = await anon.get("/healthz")
    assert r.status_code == 200 and r.json()["status"] == "ok"


@needs_sandbox
@pytest.mark.parametrize("name", ["token", "access_token", "api_key", "Authorization"])
async def test_token_in_the_query_string_is_refused(anon: httpx.AsyncClient, name: str) -> None:
    r = await anon.get("/v1/sandboxes", params={name: TOKEN}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 401 and "query string" in r.json()["message"]


@needs_sandbox
async def test_client_with_a_wrong_token_gets_a_typed_error(served: Served) -> None:
    async with RemoteProvider(served.url, token="not-the-token-at-all") as remote:
        with pytest.raises(ConfigError) as err:
            await remote.list_sandboxes()
    assert err.value.error_code == "unauthorized" and err.value.http_status == 401
    async with RemoteProvider(served.url, token="not-the-token") as remote:
        with pytest.raises(ConfigError) as err:
            await remote.get("sb-000000000000")  # the lean path (calls held in memory) sends it as well
    assert err.value.error_code == "unauthorized"


def test_a_token_that_would_break_the_header_is_refused_at_once() -> None:
    for token in ("abc\r\nX-Evil: 1", "t\u00f6ken", "tab\there"):
        with pytest.raises(ConfigError, match="token"):
            RemoteProvider("http://127.0.0.1:9", token=token)


@needs_sandbox
async def test_refusals_are_counted(anon: httpx.AsyncClient) -> None:
    await anon.get("/v1/sandboxes")
    text = (await anon.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})).text
    assert 'sandrl_failures_total{error_code="unauthorized"}' in text


def test_token_from_file_or_env_never_argv(tmp_path: Path) -> None:
    f = tmp_path / "token"
    f.write_text("  " + "a" * 32 + "\n")
    assert load_token(f, env={}) == "a" * 32
    assert load_token(None, env={"SANDRL_TOKEN": "b" * 20}) == "b" * 20
    assert load_token(f, env={"SANDRL_TOKEN": "b" * 20}) == "a" * 32  # the file wins
    assert load_token(None, env={}) is None
    for bad in ("short", "has spaces in the middle of it"):
        f.write_text(bad)
        with pytest.raises(ConfigError):
            load_token(f, env={})
    with pytest.raises(ConfigError, match="cannot read"):
        load_token(tmp_path / "missing", env={})


def test_without_a_token_only_loopback_is_served() -> None:
    assert bind_host("0.0.0.0", "t" * 32) == ("0.0.0.0", None)
    host, warning = bind_host("0.0.0.0", None)
    assert host == "127.0.0.1" and warning is not None and "SANDRL_TOKEN" in warning
    host, warning = bind_host("::1", None)
    assert host == "::1" and warning is not None and "without auth" in warning
