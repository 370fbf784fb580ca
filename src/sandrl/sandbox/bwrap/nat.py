"""Outbound network without the host's loopback: slirp4netns in front of a sandbox's own namespace.

What image builds get (Docker builds have the network; a third-party Dockerfile must not reach
the services on the host's loopback, e.g. an unauthenticated inference server). The sandbox keeps
its own network namespace; slirp4netns makes a tap device in it (10.0.2.100/24, gateway 10.0.2.2,
DNS 10.0.2.3) and carries its connections out as ordinary sockets of the host:

- ``--disable-host-loopback``: the gateway does not lead to the host's ``127.0.0.1``; the
  sandbox's own ``127.0.0.1`` stays its own;
- slirp4netns parses what a hostile sandbox sends, so it runs with ``--enable-sandbox`` (its own
  mount namespace, every capability but ``CAP_NET_BIND_SERVICE`` dropped) and
  ``--enable-seccomp``, inside the sandbox's cgroup (its CPU and memory are the sandbox's, and it
  dies with it), and exits when the provider lets go of it (``--exit-fd``).

It joins the sandbox through the sandbox's outer user namespace (``--userns-path``), as rootless
container engines do.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import tempfile
import warnings
from dataclasses import dataclass
from typing import IO

from sandrl.errors import SandboxCreateError, SandboxError
from sandrl.processes import reap_in_background
from sandrl.sandbox.bwrap.cgroups import SandboxCgroup
from sandrl.sandbox.bwrap.sandbox import BwrapSandbox

__all__ = ["DNS_SERVER", "RESOLV_CONF", "Nat", "nat_available", "nat_or_warn", "point_dns_at_nat", "start_nat"]

DNS_SERVER = "10.0.2.3"
READY_TIMEOUT_S = 10.0
MTU = 65520


def nat_available() -> bool:
    return shutil.which("slirp4netns") is not None


@dataclass
class Nat:
    """One sandbox's slirp4netns; :meth:`close` ends it."""

    process: subprocess.Popen[bytes]
    exit_fd: int

    def close(self) -> None:
        if self.exit_fd >= 0:
            os.close(self.exit_fd)  # slirp4netns exits when this end of its pipe closes
            self.exit_fd = -1
        try:
            self.process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=2)
            reap_in_background(self.process)


async def start_nat(host_pid: int, group: SandboxCgroup) -> Nat:
    """Start slirp4netns for the sandbox whose pid 1 is host pid ``host_pid``; wait until it is up."""
    program = shutil.which("slirp4netns")
    if program is None:
        raise SandboxCreateError("slirp4netns is not installed (apt-get install slirp4netns)")
    # What it says, read only if it fails (a pipe nobody reads later would stall it).
    with tempfile.TemporaryFile() as log:
        return await _start(program, host_pid, group, log)


async def _start(program: str, host_pid: int, group: SandboxCgroup, log: IO[bytes]) -> Nat:
    ready_r, ready_w = os.pipe()
    exit_r, exit_w = os.pipe()
    argv = [
        program,
        "--configure",
        f"--mtu={MTU}",
        "--disable-host-loopback",
        "--enable-sandbox",
        "--enable-seccomp",
        f"--ready-fd={ready_w}",
        f"--exit-fd={exit_r}",
        f"--userns-path=/proc/{host_pid}/ns/user",
        str(host_pid),
        "tap0",
    ]
    try:
        process = subprocess.Popen(
            argv,
            pass_fds=(ready_w, exit_r),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    except OSError as exc:
        for fd in (ready_r, ready_w, exit_r, exit_w):
            os.close(fd)
        raise SandboxCreateError(f"cannot start slirp4netns: {exc}") from exc
    os.close(ready_w)
    os.close(exit_r)
    nat = Nat(process, exit_w)
    try:
        for procs in group.procs_files:
            procs.write_text(str(process.pid))
        async with asyncio.timeout(READY_TIMEOUT_S):
            ready = await asyncio.to_thread(os.read, ready_r, 1)
        if ready != b"1":
            log.seek(0)
            detail = log.read()[-500:].decode(errors="replace").strip()
            raise SandboxCreateError(f"slirp4netns did not bring the sandbox's network up: {detail}")
    except BaseException as exc:
        nat.close()
        if isinstance(exc, TimeoutError):
            raise SandboxCreateError(f"slirp4netns was not up within {READY_TIMEOUT_S:g} s") from exc
        raise
    finally:
        os.close(ready_r)
    return nat


RESOLV_CONF = frozenset({"/etc/resolv.conf"})
"""Written for the DNS of a sandbox behind slirp4netns; an image build leaves it out of its layers (as Docker's do)."""
_WARNED: list[bool] = []


def nat_or_warn() -> bool:
    """Whether build steps get the network through slirp4netns; without it, once, why not."""
    if nat_available():
        return True
    if not _WARNED:
        _WARNED.append(True)
        warnings.warn(
            "slirp4netns is not installed, so RUN steps with the network share the host's network, its "
            "loopback services included; apt-get install slirp4netns",
            stacklevel=3,
        )
    return False


async def point_dns_at_nat(sandbox: BwrapSandbox) -> None:
    """Point the step's resolver at slirp4netns's DNS (an image's own resolv.conf names nothing reachable)."""
    result = await sandbox.exec(
        f"mkdir -p /etc && rm -f /etc/resolv.conf && echo 'nameserver {DNS_SERVER}' > /etc/resolv.conf",
        timeout_s=30,
        cwd="/",
    )
    if not result.ok:
        raise SandboxError(
            f"cannot point {sandbox.id}'s resolver at {DNS_SERVER}: {(result.stderr or result.stdout).strip()}"
        )
