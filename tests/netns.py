"""Test hosts in network namespaces the test makes: a packet aimed at them never leaves this machine.

:func:`two_hosts` makes a "host" namespace, where the code under test runs, and a "world" one
behind it, joined by a veth pair; the world holds every address a test aims at (public-looking
documentation addresses, a private range, cloud metadata's 169.254.169.254) on its loopback.
Neither namespace has any other interface, so even wrong code cannot send a packet out of them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["HOST_ADDR", "WORLD_ADDR", "WORLD_ADDRESSES", "Netns", "netns_reason", "two_hosts"]

HOST_ADDR = "198.51.100.1"
"""The host namespace's own address (its side of the veth)."""
WORLD_ADDR = "198.51.100.2"
WORLD_ADDRESSES = {
    "public": "203.0.113.10",
    "private": "10.77.0.5",
    "resolver": "10.77.0.53",
    "metadata": "169.254.169.254",
}
"""The world's addresses, on its dummy interface, by what they stand for."""


def netns_reason() -> str | None:
    """Why namespaced test hosts cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "nsenter", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (iproute2, util-linux)"
    return None


@dataclass
class Netns:
    name: str

    @property
    def path(self) -> str:
        return f"/run/netns/{self.name}"

    def argv(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this namespace (its mounts stay the caller's: cgroups stay visible)."""
        return ["nsenter", f"--net={self.path}", "--", *argv]

    def run(self, argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(self.argv(argv), capture_output=True, text=True, **kwargs)
        if done.returncode != 0:
            raise AssertionError(f"in {self.name}: {' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
        return done

    def popen(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[str]:
        return subprocess.Popen(self.argv(argv), text=True, **kwargs)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextlib.contextmanager
def two_hosts() -> Iterator[tuple[Netns, Netns]]:
    """(host, world): host 198.51.100.1/24 routes everything to world 198.51.100.2, which also
    holds :data:`WORLD_ADDRESSES`. Both are removed on exit."""
    tag = uuid.uuid4().hex[:6]
    host, world = Netns(f"sandrl-h-{tag}"), Netns(f"sandrl-w-{tag}")
    made: list[Netns] = []
    try:
        for ns in (host, world):
            _ip("netns", "add", ns.name)
            made.append(ns)
        peer = ["peer", "name", f"sw{tag}", "netns", world.name]
        _ip("link", "add", f"sh{tag}", "netns", host.name, "type", "veth", *peer)
        host.run(["ip", "link", "set", "lo", "up"])
        host.run(["ip", "addr", "add", f"{HOST_ADDR}/24", "dev", f"sh{tag}"])
        host.run(["ip", "link", "set", f"sh{tag}", "up"])
        host.run(["ip", "route", "add", "default", "via", WORLD_ADDR])
        world.run(["ip", "link", "set", "lo", "up"])
        world.run(["ip", "addr", "add", f"{WORLD_ADDR}/24", "dev", f"sw{tag}"])
        world.run(["ip", "link", "set", f"sw{tag}", "up"])
        for address in WORLD_ADDRESSES.values():  # on its loopback: kernels without the dummy module
            world.run(["ip", "addr", "add", f"{address}/32", "dev", "lo"])
        yield host, world
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns.name], capture_output=True)


def write_resolv_conf(directory: Path, nameserver: str) -> Path:
    """A resolv.conf naming ``nameserver``, for a process that mounts it over /etc/resolv.conf."""
    path = directory / "resolv.conf"
    path.write_text(f"nameserver {nameserver}\n")
    return path
