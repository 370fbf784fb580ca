"""Build steps have the network (as Docker's), through slirp4netns: the world, not the host's loopback."""

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
for name, host, port in [("loopback", "127.0.0.1", {loop}), ("gateway", "10.0.2.2", {loop}), ("host", "{ip}", {port})]:
    try:
        socket.create_connection((host, port), timeout=3).close()
        print(name, "reached")
    except OSError as exc:
        print(name, "refused" if isinstance(exc, ConnectionRefusedError) else "unreachable")
EOF"""


def _host_address() -> str | None:
    """An address of this host that is not loopback (where a container would reach its host)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing address
        address = probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()
    return None if address.startswith("127.") else address


@pytest.fixture
def listeners() -> Iterator[tuple[int, int]]:
    """A server on the host's loopback only, and one on every address."""
    loop, anywhere = socket.socket(), socket.socket()
    loop.bind(("127.0.0.1", 0))
    anywhere.bind(("0.0.0.0", 0))
    for s in (loop, anywhere):
        s.listen(8)
    stop = threading.Event()

    def accept(s: socket.socket) -> None:
        s.settimeout(0.2)
        while not stop.is_set():
            try:
                s.accept()[0].close()
            except OSError:
                continue

    threads = [threading.Thread(target=accept, args=(s,), daemon=True) for s in (loop, anywhere)]
    for t in threads:
        t.start()
    yield loop.getsockname()[1], anywhere.getsockname()[1]
    stop.set()
    for s in (loop, anywhere):
        s.close()


async def test_a_build_step_reaches_the_host_but_not_its_loopback(
    provider: BwrapProvider, tmp_path: Path, listeners: tuple[int, int]
) -> None:
    address = _host_address()
    if address is None:
        pytest.skip("this host has no address but loopback")
    loop, port = listeners
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "probe.sh").write_text(PROBE.format(loop=loop, ip=address, port=port) + "\n")
    (ctx / "Dockerfile").write_text("FROM host\nCOPY probe.sh /opt/\nRUN sh /opt/probe.sh > /opt/probe\n")
    built = await ImageBuilder(provider).build(ctx / "Dockerfile", options=BuildOptions(use_cache=False))
    async with await provider.create(SandboxSpec(image=built.image, ttl_s=60)) as sandbox:
        probe = await sandbox.exec("cat /opt/probe; cat /etc/resolv.conf")
    lines = probe.stdout.splitlines()
    assert lines[:3] == ["loopback refused", "gateway unreachable", "host reached"], probe
    with open("/etc/resolv.conf") as f:  # the step's resolver setting is not in the image
        assert "\n".join(lines[3:]) == f.read().strip()


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
