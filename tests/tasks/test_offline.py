"""Tests that need the network in a sandbox without one are an infra error, not a reward 0."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sandrl.tasks import VerifyResult, load_task, prepare_environment, verify
from sandrl.tasks.offline import FALLBACK_HOST, failed_host

from .conftest import FIXTURES, SandboxFactory

HELLO = FIXTURES / "harbor" / "hello-file"

# What the tools print, verbatim as far as it matters.
CURL = "curl: (6) Could not resolve host: astral.sh\n"
PIP = (
    "WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) after connection "
    "broken by 'NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object at 0x7f>: Failed to "
    "establish a new connection: [Errno -3] Temporary failure in name resolution')': /simple/pytest/\n"
    "ERROR: Could not find a version that satisfies the requirement pytest (from versions: none)\n"
)
APT = "Err:1 http://deb.debian.org/debian bookworm InRelease\n  Temporary failure resolving 'deb.debian.org'\n"
NPM = "npm ERR! request to https://registry.npmjs.org/jest failed, reason: getaddrinfo EAI_AGAIN registry.npmjs.org\n"
WGET = "Resolving github.com (github.com)... failed: Temporary failure in name resolution.\n"


@pytest.mark.parametrize(
    ("output", "host"),
    [
        (CURL, "astral.sh"),
        ("downloading https://files.pythonhosted.org/x.whl\n" + PIP, "files.pythonhosted.org"),
        (PIP, FALLBACK_HOST),
        (APT, "deb.debian.org"),
        (NPM, "registry.npmjs.org"),
        ("--2024-01-01--  https://github.com/x/y.tar.gz\n" + WGET, "github.com"),
        ("connect: Network is unreachable\n", FALLBACK_HOST),
    ],
)
def test_network_failures_are_recognised_with_their_host(output: str, host: str) -> None:
    found = failed_host("some test output\n" + output)
    assert found is not None and found[1] == host


def test_ordinary_failures_are_not_network_failures() -> None:
    assert failed_host("FAILED tests/test_x.py::test_y - AssertionError: assert 1 == 2\n") is None
    assert failed_host("ModuleNotFoundError: No module named 'requests'\n") is None


async def _verify_with(
    make_sandbox: SandboxFactory, tmp_path: Path, script: str, *, internet: bool = True
) -> VerifyResult:
    task_dir = tmp_path / f"fetches-{len(list(tmp_path.iterdir()))}"
    shutil.copytree(HELLO, task_dir)
    (task_dir / "tests" / "test.sh").write_text(f"#!/bin/bash\n{script}\n")
    config = task_dir / "task.toml"
    config.write_text(config.read_text().replace("allow_internet = false", f"allow_internet = {str(internet).lower()}"))
    task = load_task(task_dir)
    sandbox = make_sandbox(workdir=task.environment.workdir, env=task.to_sandbox_spec().env)
    await prepare_environment(task, sandbox)
    return await verify(task, sandbox)


async def test_a_test_script_that_fetches_its_tools_offline_is_an_infra_error(
    make_sandbox: SandboxFactory, tmp_path: Path
) -> None:
    # The shape of many published test.sh files; .invalid never resolves (RFC 6761), here or anywhere.
    script = (
        "curl -LsSf https://tools.example.invalid/uv/install.sh | sh\n"
        "if command -v uvx >/dev/null; then echo 1; else echo 0; fi > /logs/verifier/reward.txt"
    )
    result = await _verify_with(make_sandbox, tmp_path, script, internet=False)
    assert (result.reward, result.passed, result.infra_error) == (0.0, False, True)
    error = result.error or ""
    assert "needed the network" in error and "allow_internet = false" in error
    assert "Could not resolve host: tools.example.invalid" in error

    result = await _verify_with(make_sandbox, tmp_path, script, internet=True)
    assert result.infra_error and "this host gives the sandbox no network" in (result.error or "")


async def test_network_words_where_the_network_works_are_a_plain_failure(
    make_sandbox: SandboxFactory, tmp_path: Path
) -> None:
    # localhost resolves in every sandbox: the tests failed for their own reasons, and that is the agent's 0.
    script = "echo 'curl: (6) Could not resolve host: localhost'\necho 0 > /logs/verifier/reward.txt"
    result = await _verify_with(make_sandbox, tmp_path, script)
    assert (result.reward, result.passed, result.infra_error, result.error) == (0.0, False, False, None)
    # And tests that passed stay passed, whatever they printed.
    script = "curl -sS https://tools.example.invalid/x || true\necho 1 > /logs/verifier/reward.txt"
    result = await _verify_with(make_sandbox, tmp_path, script)
    assert (result.reward, result.passed, result.infra_error) == (1.0, True, False)
