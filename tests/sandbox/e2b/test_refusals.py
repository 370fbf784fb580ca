"""What the E2B-compatible API refuses: wrong keys and tokens, and what it does not support yet."""

from __future__ import annotations

import httpx
import pytest
from e2b import AuthenticationException, PtySize, Sandbox, SandboxException

from .conftest import E2BServer


def test_wrong_api_key_is_refused(e2b_server: E2BServer) -> None:
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key="not-the-token-at-all-0000")
    with pytest.raises(AuthenticationException):
        Sandbox.list(api_key="not-the-token-at-all-0000").next_items()
    answer = httpx.get(e2b_server.url + "/v2/sandboxes", headers={"X-API-Key": "wrong-wrong-wrong"})
    assert answer.status_code == 401
    assert answer.json()["code"] == 401 and "E2B_API_KEY" in answer.json()["message"]
    assert httpx.get(e2b_server.url + "/v2/sandboxes").status_code == 401


def test_envd_calls_need_the_sandbox_access_token(e2b_server: E2BServer) -> None:
    sb = Sandbox.create(timeout=60)
    try:
        headers = {"E2b-Sandbox-Id": sb.sandbox_id, "E2b-Sandbox-Port": "49983"}
        for token in (None, "wrong"):
            sent = headers | ({"X-Access-Token": token} if token else {})
            answer = httpx.get(e2b_server.url + "/files", params={"path": "/etc/hostname"}, headers=sent)
            assert answer.status_code == 401, answer.text
        answer = httpx.post(
            e2b_server.url + "/process.Process/List",
            content=b"{}",
            headers=headers | {"Content-Type": "application/json", "X-Access-Token": "wrong"},
        )
        assert answer.status_code == 401 and answer.json()["code"] == "unauthenticated"
        # The API key is not an envd credential either.
        answer = httpx.get(
            e2b_server.url + "/files",
            params={"path": "/etc/hostname"},
            headers=headers | {"X-API-Key": e2b_server.token},
        )
        assert answer.status_code == 401
    finally:
        sb.kill()


def test_a_killed_sandbox_is_not_running(e2b_server: E2BServer) -> None:
    sb = Sandbox.create(timeout=60)
    sb.kill()
    with pytest.raises(SandboxException, match="was not found"):
        sb.commands.run("true")
    with pytest.raises(SandboxException, match="was not found"):
        sb.files.read("/etc/hostname")


def test_unknown_template(e2b_server: E2BServer) -> None:
    with pytest.raises(SandboxException, match="template 'no-such-image' not found"):
        Sandbox.create("no-such-image")


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/sandboxes/{id}/snapshots", None),
        ("PUT", "/sandboxes/{id}/network", {"allowOut": ["1.1.1.1"]}),
        ("POST", "/v3/templates", {"name": "t"}),
        ("POST", "/templates/t/builds/b", {}),
        ("GET", "/v2/templates", None),
        ("POST", "/v2/sandboxes", {"templateID": "base", "autoPause": True, "autoResume": {"enabled": True}}),
        ("POST", "/snapshots", {}),
        ("POST", "/v2/sandboxes", {"templateID": "base", "network": {"denyOut": ["0.0.0.0/0"]}}),
        ("POST", "/v2/sandboxes", {"templateID": "base", "volumeMounts": [{"name": "v", "path": "/v"}]}),
    ],
)
def test_unsupported_calls_say_so(e2b_server: E2BServer, method: str, path: str, body: object) -> None:
    answer = httpx.request(
        method,
        e2b_server.url + path.replace("{id}", "sb-any"),
        json=body,
        headers={"X-API-Key": e2b_server.token},
        timeout=10,
    )
    assert answer.status_code == 400, answer.text
    error = answer.json()
    assert error["code"] == 400 and error["error_code"] == "not_supported"
    assert "not supported yet" in error["message"]


def test_unsupported_sdk_calls_raise_the_sdk_exception(e2b_server: E2BServer) -> None:
    sb = Sandbox.create(timeout=60)
    try:
        with pytest.raises(SandboxException, match="not supported yet"):
            sb.files.watch_dir("/tmp")
        with pytest.raises(SandboxException, match="not supported yet"):
            sb.pty.create(size=PtySize(rows=24, cols=80))
        assert sb.commands.run("echo still fine").stdout == "still fine\n"
    finally:
        sb.kill()
    with pytest.raises(SandboxException, match="not supported yet"):
        Sandbox.create(network={"deny_out": ["0.0.0.0/0"]})
