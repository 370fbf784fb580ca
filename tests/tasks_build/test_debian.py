"""FROM debian: the Debian base image made with debootstrap, then a Dockerfile built on it (needs the network)."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

import sandrl.sandbox.bwrap.provider
from sandrl.cli import app
from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.sandbox.bwrap.dockerfile.builder import ImageBuilder


def _online(host: str = "deb.debian.org") -> bool:
    try:
        socket.create_connection((host, 80), timeout=3).close()
    except OSError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("debootstrap") is None, reason="debootstrap is not installed")
async def test_debian_base_and_a_build_on_it(
    provider: BwrapProvider, state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not provider.images.exists("debian"):
        if not _online():
            pytest.skip("offline: debootstrap needs deb.debian.org")
        monkeypatch.setattr(sandrl.sandbox.bwrap.provider, "DEFAULT_STATE_DIR", state_dir)
        result = CliRunner().invoke(app, ["images", "build", "debian"], catch_exceptions=False)
        assert result.exit_code == 0, result.output
    (tmp_path / "hello.sh").write_text("echo hello from $(cat /etc/debian_version)\n")
    (tmp_path / "Dockerfile").write_text(
        "FROM debian:bookworm\nWORKDIR /app\nCOPY hello.sh ./\n"
        "RUN useradd -m alice && rm -rf /var/log/apt\nUSER alice\nRUN whoami > /tmp/me\n"
    )
    built = await ImageBuilder(provider).build(tmp_path / "Dockerfile")
    assert built.built == 3
    async with await provider.create(SandboxSpec(image=built.image, workdir="/app", ttl_s=120)) as sandbox:
        out = await sandbox.exec("sh hello.sh; cat /tmp/me; test ! -e /var/log/apt && echo gone; id -u alice")
    assert out.ok, out
    lines = out.stdout.splitlines()
    assert lines[0].startswith("hello from 12.") and lines[1:] == ["alice", "gone", "1000"]
