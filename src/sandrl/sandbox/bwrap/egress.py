"""What a sandbox with the network may reach: a cgroup BPF filter on its NAT's connects and sends.

A sandbox never shares the host's network namespace. With ``network=True`` it gets egress
through slirp4netns (:mod:`.nat`), which turns the sandbox's packets into ordinary sockets of
the host: whatever those sockets may reach, the sandbox reaches. slirp4netns's
``--disable-host-loopback`` keeps its gateway from leading to the host's ``127.0.0.1``, and
nothing more: the host's other addresses, cloud metadata (169.254.169.254) and the private
network behind the host would still answer. So a BPF program (``cgroup/connect4``,
``connect6``, ``sendmsg4``, ``sendmsg6``) is attached to each such sandbox's cgroup v2 group,
where its slirp4netns runs, and refuses (``EPERM``: the sandbox sees the connection fail):

- always: loopback (127/8), 0/8 (which reaches the host itself), link-local (169.254/16: cloud
  metadata), multicast and the reserved 240/4, and every address of the host's own interfaces;
- unless ``allow`` names them: the private ranges (10/8, 172.16/12, 192.168/16, CGNAT
  100.64/10, 192.0.0/24, 198.18/15);
- every IPv6 destination (slirp4netns gives sandboxes IPv4 only);

except the host's resolvers (``/etc/resolv.conf``) on port 53, where slirp4netns forwards the
sandbox's DNS. The program lets through whatever does not come from the host's network
namespace (the cookie it was loaded with): the sandbox's own processes, in their own namespace,
talk to their own loopback as they like.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import os
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address
from pathlib import Path

from sandrl.errors import ConfigError, SandboxCreateError
from sandrl.host_memory import recent
from sandrl.sandbox.bwrap import bpf

__all__ = ["NEVER", "PRIVATE", "EgressFilter", "EgressRules", "parse_allow"]

NEVER = tuple(IPv4Network(n) for n in ("127.0.0.0/8", "0.0.0.0/8", "169.254.0.0/16", "224.0.0.0/4", "240.0.0.0/4"))
"""Never reachable from a sandbox, whatever the configuration."""
PRIVATE = tuple(
    IPv4Network(n)
    for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "192.0.0.0/24", "198.18.0.0/15")
)
"""Reachable only when the configuration's allow-list names them (or a part of them)."""
DNS_PORT = 53
RULES_MAX_AGE_S = 2.0
"""How old a reading of the host's addresses and resolvers a new sandbox's filter may be built on."""
_SO_NETNS_COOKIE = 71


def parse_allow(ranges: list[str] | tuple[str, ...]) -> tuple[IPv4Network, ...]:
    """Check a configuration's allow-list: IPv4 ranges inside the private ones."""
    parsed: list[IPv4Network] = []
    for text in ranges:
        try:
            net = ipaddress.ip_network(text, strict=False)
        except ValueError as exc:
            raise ConfigError(
                f"egress allow-list entry {text!r} is not an address range ({exc}); write e.g. 10.1.0.0/16"
            ) from None
        if not isinstance(net, IPv4Network):
            raise ConfigError(f"egress allow-list entry {text!r} is IPv6; sandboxes get IPv4 only")
        if any(net.overlaps(n) for n in NEVER):
            raise ConfigError(
                f"egress allow-list entry {text!r} overlaps loopback, link-local, multicast or 0/8, which no "
                "sandbox may reach"
            )
        if not any(net.subnet_of(p) for p in PRIVATE):
            raise ConfigError(
                f"egress allow-list entry {text!r} is not inside a private range "
                f"({', '.join(map(str, PRIVATE))}): public addresses are reachable without it"
            )
        parsed.append(net)
    return tuple(parsed)


@dataclass(frozen=True)
class EgressRules:
    """Everything a filter is built from."""

    allow: tuple[IPv4Network, ...]
    nameservers4: tuple[IPv4Address, ...]
    nameservers6: tuple[IPv6Address, ...]
    host_addresses: tuple[IPv4Address, ...]
    netns_cookie: int

    @staticmethod
    def of_host(allow: tuple[IPv4Network, ...]) -> EgressRules:
        """The rules for this host now: its resolvers, its own addresses, its network namespace."""
        servers = recent(("egress", "resolvers"), _resolvers, RULES_MAX_AGE_S)
        return EgressRules(
            allow,
            tuple(a for a in servers if isinstance(a, IPv4Address)),
            tuple(a for a in servers if isinstance(a, IPv6Address)),
            recent(("egress", "addresses"), _host_addresses, RULES_MAX_AGE_S),
            recent(("egress", "netns"), _netns_cookie, RULES_MAX_AGE_S),
        )


def _le32(packed: bytes) -> int:
    """Four bytes in network order as the program reads them (a u32 load on a little-endian host)."""
    return int.from_bytes(packed, sys.byteorder)


_DNS_PORT = _le32(DNS_PORT.to_bytes(2, "big") + b"\0\0")


def _program(rules: EgressRules, checks: Callable[[bpf.Program], None]) -> bpf.Program:
    """A program that allows what does not come from the host's network namespace, then runs
    ``checks`` (which jump to ``allow`` or ``deny``, or fall through to allow)."""
    p = bpf.Program()
    p.mov(6, 1)  # keep the context: the call clobbers r1-r5
    p.call(bpf.GET_NETNS_COOKIE)  # r1 is still the context
    p.load_u64_imm(2, rules.netns_cookie)
    p.jne(0, 2, "allow")  # not the host's namespace: a sandbox's own traffic
    checks(p)
    p.label("allow")
    p.mov_imm(0, 1)
    p.exit()
    p.label("deny")
    p.mov_imm(0, 0)
    p.exit()
    return p


def _checks4(rules: EgressRules, p: bpf.Program) -> None:
    p.load_u32(7, 6, bpf.USER_IP4)
    p.load_u32(8, 6, bpf.USER_PORT)
    for i, server in enumerate(rules.nameservers4):
        p.jne32_imm(7, _le32(server.packed), f"ns{i}")
        p.jeq32_imm(8, _DNS_PORT, "allow")
        p.label(f"ns{i}")

    def match(nets: tuple[IPv4Network, ...], to: str) -> None:
        for net in nets:
            p.mov32(2, 7)
            p.and32_imm(2, _le32(net.netmask.packed))
            p.jeq32_imm(2, _le32(net.network_address.packed), to)

    match(NEVER, "deny")
    for address in rules.host_addresses:
        p.jeq32_imm(7, _le32(address.packed), "deny")
    match(rules.allow, "allow")
    match(PRIVATE, "deny")


def _checks6(rules: EgressRules, p: bpf.Program) -> None:
    p.load_u32(8, 6, bpf.USER_PORT)
    p.jne32_imm(8, _DNS_PORT, "deny")
    for i, server in enumerate(rules.nameservers6):
        for word in range(4):
            p.load_u32(7, 6, bpf.USER_IP6 + 4 * word)
            p.jne32_imm(7, _le32(server.packed[4 * word : 4 * word + 4]), f"ns{i}")
        p.ja("allow")
        p.label(f"ns{i}")
    p.ja("deny")  # every other IPv6 destination


class EgressFilter:
    """The loaded programs for the current :class:`EgressRules`; :meth:`attach` puts them on a group.

    Loaded once and kept (attaching is a syscall per hook); built again when the host's addresses
    or resolvers change.
    """

    def __init__(self, allow: tuple[IPv4Network, ...] = ()) -> None:
        self.allow = allow
        self._rules: EgressRules | None = None
        self._fds: dict[int, int] = {}

    def attach(self, cgroup_dir: Path | None) -> None:
        """Filter what the processes of ``cgroup_dir`` (a cgroup v2 group) connect to from the host's namespace."""
        if cgroup_dir is None:
            raise SandboxCreateError(
                "a sandbox with the network needs a cgroup v2 group for its egress filter, and this host has "
                "no cgroup2 mount (/sys/fs/cgroup or /sys/fs/cgroup/unified); create it with network=False"
            )
        rules = EgressRules.of_host(self.allow)
        try:
            if rules != self._rules:
                self._load(rules)
            for attach_type, fd in self._fds.items():
                bpf.attach(fd, cgroup_dir, attach_type)
        except bpf.BpfError as exc:
            raise SandboxCreateError(
                f"cannot filter the sandbox's egress ({exc}); sandrl needs cgroup BPF (a kernel with "
                "CONFIG_CGROUP_BPF, run as root) to give a sandbox the network: create it with network=False"
            ) from exc

    def _load(self, rules: EgressRules) -> None:
        v4 = _program(rules, functools.partial(_checks4, rules))
        v6 = _program(rules, functools.partial(_checks6, rules))
        programs = {bpf.CONNECT4: v4, bpf.SENDMSG4: v4, bpf.CONNECT6: v6, bpf.SENDMSG6: v6}
        fds: dict[int, int] = {}
        try:
            for attach_type, program in programs.items():
                fds[attach_type] = bpf.load(program, attach_type, f"sandrl_egress{attach_type}")
        except BaseException:
            for fd in fds.values():
                os.close(fd)
            raise
        self.close()
        self._fds, self._rules = fds, rules

    def close(self) -> None:
        """Let go of the loaded programs (those attached stay until their groups are removed)."""
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds, self._rules = {}, None


def _resolvers(path: Path = Path("/etc/resolv.conf")) -> tuple[IPv4Address | IPv6Address, ...]:
    found: list[IPv4Address | IPv6Address] = []
    with contextlib.suppress(OSError):
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[0] == "nameserver":
                with contextlib.suppress(ValueError):
                    found.append(ipaddress.ip_address(parts[1].split("%")[0]))
    return tuple(found)


def _host_addresses(fib_trie: Path = Path("/proc/net/fib_trie")) -> tuple[IPv4Address, ...]:
    """Every IPv4 address of this network namespace's interfaces (the kernel's local routes)."""
    found: set[IPv4Address] = set()
    last = ""
    with contextlib.suppress(OSError):
        for line in fib_trie.read_text().splitlines():
            text = line.strip()
            if text.startswith(("|--", "+--")):
                last = text[3:].strip().split("/")[0]
            elif text == "/32 host LOCAL" and last:
                with contextlib.suppress(ValueError):
                    found.add(IPv4Address(last))
    return tuple(sorted(found))


def _netns_cookie() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        return int.from_bytes(s.getsockopt(socket.SOL_SOCKET, _SO_NETNS_COOKIE, 8), sys.byteorder)
