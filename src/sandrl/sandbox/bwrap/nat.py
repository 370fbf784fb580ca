"""A sandbox's network: its own namespace, with egress through slirp4netns, never the host's.

Every sandbox has a network namespace of its own (the helper makes it, with loopback up). One with
``network=True`` (a task with ``allow_internet``, an image build's ``RUN`` step) gets the world
through slirp4netns, as rootless container engines do: a tap device in the sandbox's namespace
(10.0.2.100/24, gateway 10.0.2.2, DNS 10.0.2.3, which forwards to the host's resolvers), its
connections carried out as ordinary sockets of the host, and ``/etc/resolv.conf`` pointing at
10.0.2.3, as Docker's runtime provides one. What those sockets may reach is bounded twice:

- ``--disable-host-loopback``: the gateway does not lead to the host's ``127.0.0.1``; the
  sandbox's own ``127.0.0.1`` stays its own;
- :mod:`.egress`: a cgroup BPF filter on slirp4netns's connects and sends refuses loopback,
  link-local (cloud metadata), the host's own addresses and the private ranges (unless the
  configuration's allow-list names them), whatever slirp4netns does.

slirp4netns parses what a hostile sandbox sends, so it runs with ``--enable-sandbox`` (its own
mount namespace, every capability but ``CAP_NET_BIND_SERVICE`` dropped) and ``--enable-seccomp``,
inside the sandbox's cgroups from its first instruction (its CPU and memory are the sandbox's,
its sockets are filtered, and it dies with it), and exits when the provider lets go of it
(``--exit-fd``). It joins the sandbox through the sandbox's outer user namespace
(``--userns-path``). One slirp4netns per sandbox with the network: ~1 MiB and a few ms of CPU
at create (``sandrl bench sandbox`` measures both beside ``network=False``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from typing import IO

from sandrl.errors import SandboxCreateError, SandboxError
from sandrl.processes import reap_in_background, wait_readable
from sandrl.sandbox.bwrap.egress import EgressFilter
from sandrl.sandbox.bwrap.sandbox import BwrapSandbox

__all__ = ["DNS_SERVER", "RESOLV_CONF", "Nat", "nat_available", "point_dns_at_nat", "require_nat", "start_nat"]

DNS_SERVER = "10.0.2.3"
READY_TIMEOUT_S = 10.0
MTU = 65520
_JOIN_THEN_EXEC = 'n=$1; shift; while [ "$n" -gt 0 ]; do echo 0 >"$1" || exit 125; shift; n=$((n - 1)); done; exec "$@"'
"""slirp4netns joins the sandbox's cgroups before it runs (so its first socket is filtered): the shell
writes itself into each ``cgroup.procs``, then becomes slirp4netns. All of it in a mount namespace
of its own whose mounts are private: ``--enable-sandbox`` pivots slirp4netns's root and detaches the
old one, and where the host's mounts are shared (``/run/netns`` once ``ip netns`` has run; every
mount under systemd) that detach reached the host's own mount table and unmounted them there."""


@functools.cache
def _private_mounts() -> list[str]:
    found = shutil.which("unshare")
    if found is None:
        raise SandboxCreateError("unshare (util-linux) is not installed: apt-get install util-linux")
    return [found, "--mount", "--propagation", "private"]


def nat_available() -> bool:
    return shutil.which("slirp4netns") is not None


def require_nat() -> str:
    """slirp4netns's path, or why a sandbox cannot have the network here."""
    program = shutil.which("slirp4netns")
    if program is None:
        raise SandboxCreateError(
            "a sandbox with the network needs slirp4netns (a sandbox never shares the host's network): "
            "apt-get install slirp4netns, or create it with network=False"
        )
    return program


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


async def start_nat(sandbox: BwrapSandbox, egress: EgressFilter) -> Nat:
    """Give ``sandbox`` the network: its egress filter, slirp4netns (up when this returns) and its
    resolver; the NAT ends when the sandbox closes."""
    program = require_nat()
    egress.attach(sandbox._group.kill_dir)
    # What it says, read only if it fails (a pipe nobody reads later would stall it).
    with tempfile.TemporaryFile() as log:
        started = asyncio.ensure_future(_start(program, sandbox, log))
        try:
            await point_dns_at_nat(sandbox)  # meanwhile: it needs pid 1, not the network
        except BaseException:
            with contextlib.suppress(BaseException):
                (await started).close()
            raise
        nat = await started
    sandbox.add_close_callback(lambda _sandbox: nat.close())
    return nat


async def _start(program: str, sandbox: BwrapSandbox, log: IO[bytes]) -> Nat:
    ready_r, ready_w = os.pipe()
    exit_r, exit_w = os.pipe()
    procs = [str(p) for p in sandbox._group.procs_files]
    argv = [
        program,
        "--configure",
        f"--mtu={MTU}",
        "--disable-host-loopback",
        "--enable-sandbox",
        "--enable-seccomp",
        f"--ready-fd={ready_w}",
        f"--exit-fd={exit_r}",
        f"--userns-path=/proc/{sandbox.host_pid}/ns/user",
        str(sandbox.host_pid),
        "tap0",
    ]
    try:
        process = subprocess.Popen(
            [*_private_mounts(), "/bin/sh", "-c", _JOIN_THEN_EXEC, "sh", str(len(procs)), *procs, *argv],
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
        async with asyncio.timeout(READY_TIMEOUT_S):
            # Not a read in a worker thread: a cancelled start closes ready_r below, and a thread still
            # on its way into read() could then read whatever file took the number next.
            await wait_readable(ready_r)
        ready = os.read(ready_r, 1)
        if ready != b"1":
            log.seek(0)
            detail = log.read()[-500:].decode(errors="replace").strip()
            raise SandboxCreateError(f"slirp4netns did not bring the sandbox's network up: {detail or 'no output'}")
    except BaseException as exc:
        nat.close()
        if isinstance(exc, TimeoutError):
            raise SandboxCreateError(f"slirp4netns was not up within {READY_TIMEOUT_S:g} s") from exc
        raise
    finally:
        os.close(ready_r)
    return nat


RESOLV_CONF = frozenset({"/etc/resolv.conf"})
"""Written by the runtime for a sandbox with the network; an image build leaves it out of its layers
(as Docker's do)."""


async def point_dns_at_nat(sandbox: BwrapSandbox) -> None:
    """Point the sandbox's resolver at slirp4netns's DNS (an image's own resolv.conf names nothing reachable)."""
    result = await sandbox.exec(
        f"mkdir -p /etc && rm -f /etc/resolv.conf && echo 'nameserver {DNS_SERVER}' > /etc/resolv.conf",
        timeout_s=30,
        cwd="/",
    )
    if not result.ok:
        raise SandboxError(
            f"cannot point {sandbox.id}'s resolver at {DNS_SERVER}: {(result.stderr or result.stdout).strip()}"
        )
