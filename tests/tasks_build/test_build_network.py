"""Build steps have the network (as Docker's), through slirp4netns: their own namespace, not the host's.

What a sandbox with the network may reach is tested in ``tests/sandbox/bwrap/test_network.py``, inside
network namespaces the test makes; here only the host's loopback is aimed at."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.sandbox.bwrap.dockerfile.builder import BuildOptions, ImageBuilder
from sandrl.sandbox.bwrap.nat import nat_available

pytestmark = pytest.mark.skipif(not nat_available(), reason="slirp4netns is not installed")

PROBE = """python3 - <<'EOF'
import socket
for name, host, port in [("loopback", "127.0.0.1", {loop}), ("gateway", "10.0.2.2", {loop})]:
    try:
        socket.create_connection((host, port), timeout=3).close()
        print(name, "reached")
    except OSError as exc:
        print(name, "refused" if isinstance(exc, ConnectionRefusedError) else "unreachable")
EOF"""


@pytest.fixture
def loopback_port() -> Iterator[int]:
    """A server on the host's loopback."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                server.accept()[0].close()
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()


async def test_a_build_step_does_not_reach_the_hosts_loopback(
    provider: BwrapProvider, tmp_path: Path, loopback_port: int
) -> None:
    loop = loopback_port
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "probe.sh").write_text(PROBE.format(loop=loop) + "\n")
    (ctx / "Dockerfile").write_text("FROM host\nCOPY probe.sh /opt/\nRUN sh /opt/probe.sh > /opt/probe\n")
    built = await ImageBuilder(provider).build(ctx / "Dockerfile", options=BuildOptions(use_cache=False))
    async with await provider.create(SandboxSpec(image=built.image, ttl_s=60)) as sandbox:
        probe = await sandbox.exec("cat /opt/probe; cat /etc/resolv.conf")
    lines = probe.stdout.splitlines()
    assert lines[:2] == ["loopback refused", "gateway unreachable"], probe
    with open("/etc/resolv.conf") as f:  # the step's resolver setting is not in the image
        assert "\n".join(lines[2:]) == f.read().strip()


async def test_network_none_and_no_network_builds_have_only_loopback(provider: BwrapProvider, tmp_path: Path) -> None:
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(
        "FROM host\nRUN --network=none cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' ' > /opt/a\n"
        "RUN cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' ' | sort > /opt/b\n"
    )
    built = await ImageBuilder(provider).build(ctx / "Dockerfile", options=BuildOptions(use_cache=False))
    async with await provider.create(SandboxSpec(image=built.image, ttl_s=60)) as sandbox:
        out = await sandbox.exec("cat /opt/a; echo --; cat /opt/b")
    assert out.stdout.split() == ["lo", "--", "lo", "tap0"]
    off = await ImageBuilder(provider).build(
        ctx / "Dockerfile", options=BuildOptions(use_cache=False, network=False), tag="no-net-build"
    )
    async with await provider.create(SandboxSpec(image=off.image, ttl_s=60)) as sandbox:
        out = await sandbox.exec("cat /opt/a; echo --; cat /opt/b")
    assert out.stdout.split() == ["lo", "--", "lo"]
