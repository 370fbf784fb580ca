"""``sandrl serve sandboxes`` as its own process, and the e2b SDK's environment pointed at it.

The provider tests need a service they can kill -9 and start again on the same port, as an
operator's host would be, so it runs as a process of its own (the session fixture of
``conftest.py`` runs in a thread of the test process).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from .conftest import TOKEN

SANDRL = Path(sys.executable).with_name("sandrl")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_service(state_dir: Path, port: int) -> subprocess.Popen[bytes]:
    """A service on ``port`` with its store in ``state_dir``, answering /healthz."""
    code = (
        "from sandrl.sandbox.service.server import serve; "
        f"serve('127.0.0.1', {port}, state_dir={str(state_dir)!r}, log_level='warning')"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "SANDRL_TOKEN": TOKEN})
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the sandbox service on port {port} did not start (exit {proc.poll()})")
        time.sleep(0.05)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


@contextmanager
def e2b_env(port: int) -> Iterator[None]:
    """The SDK's own settings, as a user sets them, for the service on ``port``."""
    url = f"http://127.0.0.1:{port}"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("E2B_API_URL", url)
        env.setenv("E2B_SANDBOX_URL", url)
        env.setenv("E2B_API_KEY", TOKEN)
        env.delenv("E2B_DEBUG", raising=False)
        env.delenv("E2B_DOMAIN", raising=False)
        yield


def sandrl(*args: str, state_dir: Path) -> subprocess.CompletedProcess[str]:
    """The ``sandrl`` command, as a user runs it."""
    env = {**os.environ, "SANDRL_STATE_DIR": str(state_dir)}
    return subprocess.run([str(SANDRL), *args], capture_output=True, text=True, env=env, timeout=240)
