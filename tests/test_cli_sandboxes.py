"""Every command that runs sandboxes builds them through ``sandrl.wiring.open_provider``, so each
takes ``--sandboxes`` as ``sandrl eval`` does: here ``sandrl tasks run`` against a real sandbox
service on loopback, reached through the e2b SDK's own environment."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.sandbox.service.server import BackgroundServer, create_app
from sandrl.sandbox.service.state import SandboxService, ServiceConfig

from .support import needs_sandbox

SANDRL = Path(sys.executable).with_name("sandrl")
TASK = Path(__file__).resolve().parents[1] / "src" / "sandrl" / "tasks" / "builtin" / "c-fix-crc32-tool"


class CountingService(SandboxService):
    """The real service, counting the sandboxes it was asked for."""

    created = 0

    async def create(self, *args: Any, **kwargs: Any) -> Any:
        self.created += 1
        return await super().create(*args, **kwargs)


def _sandrl(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SANDRL), *args], capture_output=True, text=True, env=env, timeout=300)


@needs_sandbox
def test_tasks_run_takes_its_sandboxes_from_a_service(tmp_path: Path) -> None:
    state = tmp_path / "service-state"
    token = secrets.token_hex(24)
    env = {**os.environ, "SANDRL_STATE_DIR": str(tmp_path / "here")}
    env.pop("E2B_DOMAIN", None)
    built = _sandrl("images", "templates", str(TASK), "--build", "--state-dir", str(state), env=env)
    assert built.returncode == 0, built.stderr
    provider = BwrapProvider(state)
    service = CountingService(provider, ServiceConfig(max_live=8))
    try:
        with BackgroundServer(create_app(service, token=token)) as server:
            remote = {**env, "E2B_API_URL": server.url, "E2B_SANDBOX_URL": server.url, "E2B_API_KEY": token}
            ran = _sandrl("tasks", "run", str(TASK), "--sandboxes", "e2b", "--json", env=remote)
    finally:
        provider._close_all_sync()
    assert ran.returncode == 0, ran.stderr[-2000:]
    summary = json.loads(ran.stdout.strip().splitlines()[-1])
    assert summary["passed"] == 1 and summary["errors"] == 0
    assert [r["reward"] for r in summary["results"]] == [1.0]
    assert service.created >= 1  # the episode's sandbox is the service's, not one of this command's own


def test_tasks_run_refuses_an_unknown_sandboxes_in_one_line(tmp_path: Path) -> None:
    r = _sandrl("tasks", "run", str(TASK), "--sandboxes", "elsewhere", env={**os.environ})
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    assert r.stderr.strip() == "error: sandboxes must be one of local, e2b, got 'elsewhere'"
