"""Every command that runs sandboxes builds them through ``sandrl.wiring.open_provider``, so each
takes ``--sandboxes`` as ``sandrl eval`` does: here ``sandrl tasks run`` against a real ``sandrl
serve sandboxes`` on loopback, reached through the e2b SDK's own environment. The commands run by
their entry point in this process (:func:`tests.entry_point.run_sandrl`)."""

from __future__ import annotations

import json
import re
import secrets
import subprocess
from pathlib import Path

import httpx
import pytest

from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.sandbox.service.server import BackgroundServer, create_app
from sandrl.sandbox.service.state import SandboxService, ServiceConfig

from .entry_point import run_sandrl
from .support import needs_sandbox

TASK = Path(__file__).resolve().parents[1] / "src" / "sandrl" / "tasks" / "builtin" / "c-fix-crc32-tool"


def _creates(url: str, token: str) -> float:
    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=10).text
    found = re.search(r"^sandrl_sandbox_creates_total (\S+)$", text, re.MULTILINE)
    assert found is not None, text[:2000]
    return float(found.group(1))


@needs_sandbox
def test_tasks_run_takes_its_sandboxes_from_a_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "service-state"
    token = secrets.token_hex(24)
    monkeypatch.delenv("E2B_DOMAIN", raising=False)

    def sandrl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        here = tmp_path / "here"
        return run_sandrl(list(args), cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys, state_dir=here, env=env)

    built = sandrl("images", "templates", str(TASK), "--build", "--state-dir", str(state))
    assert built.returncode == 0, built.stderr
    provider = BwrapProvider(state)
    try:
        # The app `sandrl serve sandboxes` serves, on a loopback port of its own (in a thread: a process
        # would add seconds of start-up to the test and nothing to what it shows).
        with BackgroundServer(create_app(SandboxService(provider, ServiceConfig(max_live=8)), token=token)) as server:
            remote = {"E2B_API_URL": server.url, "E2B_SANDBOX_URL": server.url, "E2B_API_KEY": token}
            ran = sandrl("tasks", "run", str(TASK), "--sandboxes", "e2b", "--json", env=remote)
            creates = _creates(server.url, token)
    finally:
        provider._close_all_sync()
    assert ran.returncode == 0, ran.stderr[-2000:]
    summary = json.loads(ran.stdout.strip().splitlines()[-1])
    assert summary["passed"] == 1 and summary["errors"] == 0
    assert [r["reward"] for r in summary["results"]] == [1.0]
    assert creates >= 1  # the episode's sandbox was the service's, not one of this command's own


def test_tasks_run_refuses_an_unknown_sandboxes_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["tasks", "run", str(TASK), "--sandboxes", "elsewhere"]
    r = run_sandrl(args, cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    assert r.stderr.strip() == "error: sandboxes must be one of local, e2b, got 'elsewhere'"
