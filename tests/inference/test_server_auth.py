"""Who may call ``sandrl serve inference``: its token, its control routes, loopback names, session keys,
body sizes; and sandrl's clients sending the token as SGLang's ``--api-key`` expects it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandrl.errors import ConfigError
from sandrl.inference.auth import TOKEN_ENV
from sandrl.inference.base import SamplingParams
from sandrl.inference.sglang import SGLangClient
from sandrl.inference.transport import HTTPConfig
from sandrl.wiring import ModelConfig, open_policy

from .conftest import TOKEN, Served

CONTROL = [
    ("POST", "/update_weights_from_disk", {"model_path": "/nowhere"}),
    ("POST", "/update_weight_version", {"new_version": "9"}),
    ("POST", "/pause_generation", {"mode": "in_place"}),
    ("POST", "/continue_generation", {}),
    ("POST", "/abort_request", {"abort_all": True}),
    ("POST", "/flush_cache", None),
    ("GET", "/flush_cache", None),
    ("POST", "/release_memory_occupation", {}),
    ("POST", "/update_weights_from_tensor", {}),
]
MiB = 2**20


@pytest.fixture
async def tokened(fresh_served: Served) -> AsyncIterator[httpx.AsyncClient]:
    """A client without credentials of a server started with a token."""
    assert fresh_served.token is not None
    async with httpx.AsyncClient(base_url=fresh_served.url, timeout=30) as client:
        yield client


@pytest.mark.parametrize(("method", "path", "body"), CONTROL)
async def test_control_routes_are_refused_without_a_token(
    http: httpx.AsyncClient, served: Served, method: str, path: str, body: Any
) -> None:
    before = served.engine.weight_version
    r = await http.request(method, path, json=body)
    assert r.status_code == 403 and r.json()["error_code"] == "token_required", r.text
    assert "--token-file" in r.json()["message"] and "token_file" in r.json()["message"]
    assert not served.engine.paused and served.engine.weight_version == before


async def test_a_server_without_a_token_answers_only_loopback_names(http: httpx.AsyncClient) -> None:
    generate = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}}
    assert (await http.post("/generate", json=generate)).status_code == 200
    for headers, code in (
        ({"Host": "attacker.example"}, "forbidden_host"),
        ({"Origin": "http://attacker.example"}, "forbidden_origin"),
    ):
        for method, path in (("POST", "/generate"), ("POST", "/v1/sessions"), ("GET", "/get_model_info")):
            r = await http.request(method, path, json=generate if path == "/generate" else None, headers=headers)
            assert r.status_code == 403 and r.json()["error_code"] == code, (path, r.text)


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/generate"), ("POST", "/v1/completions"), ("GET", "/get_model_info"), ("POST", "/v1/sessions")]
    + [(m, p) for m, p, _ in CONTROL[:3]],
)
async def test_with_a_token_every_route_but_health_needs_it(tokened: httpx.AsyncClient, method: str, path: str) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong-token-wrong-token"}, {"Authorization": f"Basic {TOKEN}"}):
        r = await tokened.request(method, path, json={}, headers=headers)
        assert r.status_code == 401 and r.json()["error_code"] == "unauthorized", (headers, r.text)
        assert r.headers["www-authenticate"].startswith("Bearer")
    ok = await tokened.request(method, path, json={}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status_code != 401
    # A server with a token serves other names: the token is the credential.
    named = await tokened.get(
        "/get_model_info", headers={"Authorization": f"Bearer {TOKEN}", "Host": "gpu-box.internal"}
    )
    assert named.status_code == 200


async def test_health_is_open_as_sglangs(tokened: httpx.AsyncClient) -> None:
    for path in ("/health", "/health_generate"):
        assert (await tokened.get(path)).status_code == 200


async def test_one_sessions_key_cannot_reach_another(fresh_served: Served) -> None:
    async with httpx.AsyncClient(base_url=fresh_served.url, timeout=30, headers=fresh_served.headers) as owner:
        a, b = [(await owner.post("/v1/sessions")).json() for _ in range(2)]
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with httpx.AsyncClient(timeout=30, headers={"Authorization": f"Bearer {a['api_key']}"}) as holder_of_a:
        for method, path, body in (
            ("POST", "/chat/completions", chat),
            ("GET", "/models", None),
            ("GET", "", None),
            ("DELETE", "", None),
        ):
            r = await holder_of_a.request(method, b["base_url"] + path, json=body)
            assert r.status_code == 401, (method, path, r.text)
        assert (await holder_of_a.post(a["base_url"] + "/chat/completions", json=chat)).status_code == 200
        assert (await holder_of_a.get(a["base_url"])).json()["turns"]  # its own record it may read
        r = await holder_of_a.post(f"{fresh_served.url}/v1/sessions")
        assert r.status_code == 401  # a session's key opens no sessions on a server with a token
    gateway = fresh_served.app.state.gateway
    assert b["id"] in gateway.sessions and gateway.sessions[b["id"]].turns == []


async def test_open_sessions_are_bounded_with_a_clear_error(fresh_served: Served) -> None:
    gateway = fresh_served.app.state.gateway
    while len(gateway.sessions) < gateway.max_sessions:
        gateway.open()
    async with httpx.AsyncClient(base_url=fresh_served.url, timeout=30, headers=fresh_served.headers) as owner:
        r = await owner.post("/v1/sessions")
    assert r.status_code == 429 and r.json()["error_code"] == "too_many_sessions", r.text
    assert "DELETE" in r.json()["message"]


async def test_an_oversize_body_is_refused_before_it_is_read(tokened: httpx.AsyncClient) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}

    async def body() -> AsyncIterator[bytes]:
        for _ in range(96):
            yield b" " * MiB

    declared = await tokened.post("/generate", content=b" " * (17 * MiB), headers=auth)
    assert declared.status_code == 413 and declared.json()["error_code"] == "payload_too_large"
    chunked = await tokened.post("/generate", content=body(), headers=auth)
    assert chunked.status_code == 413 and chunked.json()["error_code"] == "payload_too_large"


async def test_sglang_client_sends_the_token(fresh_served: Served, other_checkpoint: Path) -> None:
    async with SGLangClient(fresh_served.url) as anonymous:
        with pytest.raises(ConfigError) as refused:
            await anonymous.update_weights(str(other_checkpoint))
    assert refused.value.http_status == 401 and refused.value.error_code == "unauthorized"
    async with SGLangClient(fresh_served.url, http=HTTPConfig(api_key=TOKEN)) as client:
        assert await client.update_weights(str(other_checkpoint), version=3) == 3
    assert fresh_served.engine.weight_version == 3


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "inference.token"
    path.write_text(TOKEN + "\n")
    return path


async def test_model_token_file_reaches_the_clients(
    fresh_served: Served, token_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    params = SamplingParams(max_new_tokens=1, ignore_eos=True)
    for api in ("sglang", "openai"):
        with_token = ModelConfig(inference=fresh_served.url, api=api, token_file=str(token_file))  # type: ignore[arg-type]
        async with open_policy(with_token) as policy:
            assert len((await policy.generate([1, 2], params)).output_ids) == 1
        without = ModelConfig(inference=fresh_served.url, api=api)  # type: ignore[arg-type]
        with pytest.raises(ConfigError) as refused:
            async with open_policy(without) as policy:
                await policy.generate([1, 2], params)
        assert getattr(refused.value, "http_status", None) == 401
    monkeypatch.setenv(TOKEN_ENV, "short-key")  # a server's --api-key may be short: the client sends what it is
    assert ModelConfig(inference=fresh_served.url).http().api_key == "short-key"


def test_a_relative_token_file_is_relative_to_the_run_config(tmp_path: Path) -> None:
    from sandrl.train.run_config import from_dict

    data = {"model": {"inference": "http://127.0.0.1:30000", "token_file": "inference.token"}, "tasks": {"path": "t"}}
    assert from_dict(data, base=tmp_path).model.token_file == str(tmp_path / "inference.token")


def test_serve_inference_takes_its_token_from_a_file(token_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from sandrl.cli import app as cli
    from sandrl.inference import server

    seen: dict[str, Any] = {}

    def run(app: Any, **kwargs: Any) -> None:  # uvicorn's edge: the app is built, nothing is bound
        seen["app"], seen["host"] = app, kwargs["host"]

    monkeypatch.setattr(server.uvicorn, "run", run)
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    args = ["serve", "inference", "--host", "0.0.0.0", "--port", "1"]
    assert CliRunner().invoke(cli, [*args, "--token-file", str(token_file)]).exit_code == 0
    assert seen["host"] == "0.0.0.0"
    assert CliRunner().invoke(cli, args).exit_code == 0
    assert seen["host"] == "127.0.0.1"  # without a token, loopback only
    token_file.write_text("short")
    bad = CliRunner().invoke(cli, [*args, "--token-file", str(token_file)])
    assert bad.exit_code != 0 and "at least 16" in str(bad.exception or bad.output)
