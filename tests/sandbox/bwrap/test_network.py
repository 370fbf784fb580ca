"""A sandbox never shares the host's network: with ``network=True`` it reaches the world through its
own NAT, never the host's loopback or addresses, cloud metadata or a private range (unless
allowed), and names resolve as under Docker.

Everything runs in namespaces the test makes (:mod:`tests.netns`): the provider and its sandboxes
in a "host" namespace, every address aimed at in a "world" behind it. What reached the world is
read from the world's own log, not from what the sandbox believed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandrl.errors import ConfigError
from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.sandbox.bwrap.egress import parse_allow
from sandrl.sandbox.bwrap.nat import nat_available

from ...netns import WORLD_ADDR, WORLD_ADDRESSES, Netns, netns_reason, two_hosts, write_resolv_conf
from ...support import REASON

ROOT = Path(__file__).resolve().parents[3]
pytestmark = [
    pytest.mark.skipif(REASON is not None, reason=str(REASON)),
    pytest.mark.skipif(netns_reason() is not None, reason=str(netns_reason())),
    pytest.mark.skipif(not nat_available(), reason="slirp4netns is not installed"),
]


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Netns, Path]]:
    """The host namespace and the world's log, with the world's servers running."""
    log = tmp_path_factory.mktemp("world") / "arrivals"
    log.touch()
    with two_hosts() as (host, world):
        servers = world.popen(
            [sys.executable, "-m", "tests.sandbox.bwrap.net_world", str(log)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        try:
            assert servers.stdout is not None and servers.stdout.readline().strip() == "ready"
            yield host, log
        finally:
            assert servers.stdin is not None and servers.stdout is not None
            servers.stdin.close()
            servers.kill()
            servers.wait()
            servers.stdout.close()


def probe(host: Netns, log: Path, tmp_path: Path, allow: str = "") -> tuple[dict[str, object], list[str]]:
    """Run :mod:`tests.sandbox.bwrap.net_probe` in ``host``, the host's resolver being the world's; its
    result and what reached the world meanwhile."""
    resolv = write_resolv_conf(tmp_path, WORLD_ADDRESSES["resolver"])
    before = log.read_text().splitlines()
    # A mount namespace of its own, so that its /etc/resolv.conf is the world's and nothing else changes.
    script = 'mount --bind "$1" /etc/resolv.conf && shift && exec "$@"'
    argv = ["unshare", "-m", "sh", "-c", script, "sh", str(resolv)]
    argv += [sys.executable, "-m", "tests.sandbox.bwrap.net_probe", str(tmp_path / "state"), allow]
    done = subprocess.run(host.argv(argv), cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result, log.read_text().splitlines()[len(before) :]


def test_a_sandbox_with_the_network_reaches_the_world_and_nothing_of_the_host(
    hosts: tuple[Netns, Path], tmp_path: Path
) -> None:
    host, log = hosts
    result, arrivals = probe(host, log, tmp_path)
    net = result["net"]
    assert isinstance(net, dict), result
    assert net["world-public"] == "reached"
    assert net["world-veth"] == "reached"
    assert net["by-name"] == "reached"
    assert net["dns"] == WORLD_ADDRESSES["public"]  # through slirp's DNS, forwarded to the host's resolver
    assert net["udp-public"] == "echoed"
    assert result["net-resolv"] == "nameserver 10.0.2.3"
    for name in (
        "host-loopback",
        "host-loopback-via-gateway",
        "host-any-via-gateway",
        "host-address",
        "metadata",
        "private",
    ):
        assert net[name] != "reached", (name, net)
    assert net["resolver-not-dns"] != "reached"  # the resolver is open on port 53 only
    assert net["udp-private"] != "echoed"
    assert result["host-accepted"] == []  # nothing of the host's own namespace answered
    # The world's own log: only the public addresses and the resolver's DNS port saw anything.
    reached = {line for line in arrivals if not line.startswith("dns ")}
    assert reached <= {f"tcp {WORLD_ADDRESSES['public']}", f"tcp {WORLD_ADDR}", f"udp {WORLD_ADDRESSES['public']}"}
    assert f"tcp {WORLD_ADDRESSES['public']}" in reached
    assert "dns svc.test" in arrivals
    # Without the network: loopback only.
    nonet = result["nonet"]
    assert isinstance(nonet, dict), result
    assert all(v != "reached" and v != "echoed" for k, v in nonet.items() if k != "dns"), nonet
    assert nonet["dns"] != WORLD_ADDRESSES["public"]


def test_an_allowed_private_range_is_reachable_and_metadata_never(hosts: tuple[Netns, Path], tmp_path: Path) -> None:
    host, log = hosts
    result, arrivals = probe(host, log, tmp_path, allow="10.77.0.0/24")
    net = result["net"]
    assert isinstance(net, dict), result
    assert net["private"] == "reached"
    assert net["udp-private"] == "echoed"
    assert net["metadata"] != "reached"
    assert net["host-address"] != "reached" and net["host-loopback-via-gateway"] != "reached"
    assert f"tcp {WORLD_ADDRESSES['metadata']}" not in arrivals


@pytest.mark.parametrize("network", [False, True])
async def test_no_sandbox_runs_in_the_hosts_network_namespace(provider: BwrapProvider, network: bool) -> None:
    host_netns = os.readlink("/proc/self/ns/net")
    async with await provider.create(SandboxSpec(network=network, ttl_s=60)) as sandbox:
        inside = await sandbox.exec("readlink /proc/self/ns/net")
    assert inside.ok, inside
    assert inside.stdout.startswith("net:[") and host_netns not in inside.stdout


async def test_a_sandbox_with_the_network_leaves_the_hosts_mounts_as_they_were(
    provider: BwrapProvider, hosts: tuple[Netns, Path]
) -> None:
    """slirp4netns's own sandbox pivots its root: where the host's mounts are shared (``/run/netns``
    after ``ip netns``), its detach of the old root once unmounted them on the host."""
    host, _ = hosts
    before = Path("/proc/self/mountinfo").read_text()
    async with await provider.create(SandboxSpec(network=True, ttl_s=60)) as sandbox:
        assert (await sandbox.exec("true")).ok
    assert Path("/proc/self/mountinfo").read_text() == before
    host.run(["true"])  # its namespace is still there to enter


@pytest.mark.parametrize(
    "entry",
    ["169.254.0.0/16", "127.0.0.1", "0.0.0.0/0", "8.8.8.0/24", "fd00::/8", "10.0.0.0/33", "not-a-range"],
)
def test_the_allow_list_opens_only_private_ranges(entry: str) -> None:
    with pytest.raises(ConfigError):
        parse_allow([entry])
    assert parse_allow(["10.1.0.0/16", "192.168.4.0/24"])  # inside private ranges: fine


FILTER_PROBE = """
import json, socket, subprocess, sys, uuid
from pathlib import Path
from sandrl.sandbox.bwrap.cgroups import CgroupManager
from sandrl.sandbox.bwrap.egress import EgressFilter
kill_base = CgroupManager().kill_base
group = kill_base.parent / ("sandrl-egress-test-" + uuid.uuid4().hex[:8])
group.mkdir(parents=True)
try:
    EgressFilter().attach(group)
    child = '''
import json, socket, sys
out = {}
for name, family, address in json.loads(sys.argv[1]):
    s = socket.socket(getattr(socket, family), socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect((address, 80))
        out[name] = "reached"
    except PermissionError:
        out[name] = "refused"
    except OSError as exc:
        out[name] = type(exc).__name__
    finally:
        s.close()
print(json.dumps(out))
'''
    join = 'echo 0 > "$1" && shift && exec "$@"'
    argv = ["sh", "-c", join, "sh", str(group / "cgroup.procs"), sys.executable, "-c", child, sys.argv[1]]
    host = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    other = subprocess.run(["unshare", "-n", *argv], capture_output=True, text=True, check=True).stdout
    print(json.dumps({"host": json.loads(host), "own-namespace": json.loads(other)}))
finally:
    group.rmdir()
"""


def test_the_filter_judges_only_the_hosts_namespace_and_refuses_ipv6(hosts: tuple[Netns, Path]) -> None:
    host, log = hosts
    public, private = WORLD_ADDRESSES["public"], WORLD_ADDRESSES["private"]
    targets = [
        ("public", "AF_INET", public),
        ("private", "AF_INET", private),
        ("mapped-private", "AF_INET6", f"::ffff:{private}"),
        ("mapped-public", "AF_INET6", f"::ffff:{public}"),
        ("loopback6", "AF_INET6", "::1"),
    ]
    argv = [sys.executable, "-c", FILTER_PROBE, json.dumps(targets)]
    before = len(log.read_text().splitlines())
    done = subprocess.run(host.argv(argv), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    deadline = time.monotonic() + 5  # the world logs after it accepts: the connect may return first
    while len(log.read_text().splitlines()) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert log.read_text().splitlines()[before:] == [f"tcp {public}"]  # what the world saw
    result = json.loads(done.stdout)
    assert result["host"] == {
        "public": "reached",
        "private": "refused",
        "mapped-private": "refused",
        "mapped-public": "refused",  # sandboxes get IPv4 only: every IPv6 destination is refused
        "loopback6": "refused",
    }
    # A process of another network namespace (a sandbox's own) is not judged: its world is its own.
    assert result["own-namespace"]["private"] != "refused"
    assert result["own-namespace"]["loopback6"] != "refused"
