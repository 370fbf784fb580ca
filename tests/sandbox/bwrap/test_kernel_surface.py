"""What of the kernel and the host a sandbox reaches: keyrings, the seccomp filter, /proc, the environment."""

from __future__ import annotations

import asyncio
import ctypes
import os
import platform
import uuid
from pathlib import Path

import pytest

from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider, BwrapSandbox

from ...support import needs_sandbox

pytestmark = needs_sandbox


@pytest.fixture(scope="module")
def provider(either_launch: BwrapProvider) -> BwrapProvider:
    """Each test on a sandbox that bubblewrap set up and on one that the helper did (a fork's child)."""
    return either_launch


# (add_key, keyctl, bpf, perf_event_open, userfaultfd, io_uring_setup) by architecture
_SYSCALLS = {
    "x86_64": {
        "add_key": 248,
        "keyctl": 250,
        "bpf": 321,
        "perf_event_open": 298,
        "userfaultfd": 323,
        "io_uring_setup": 425,
    },
    "aarch64": {
        "add_key": 217,
        "keyctl": 219,
        "bpf": 280,
        "perf_event_open": 241,
        "userfaultfd": 282,
        "io_uring_setup": 425,
    },
}
NR = _SYSCALLS.get(platform.machine())
needs_known_arch = pytest.mark.skipif(NR is None, reason=f"no syscall numbers for {platform.machine()} in this test")
KEY_SPEC_SESSION_KEYRING = -3
KEYCTL_READ = 11


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


@needs_known_arch
async def test_host_session_keyring_is_not_shared(provider: BwrapProvider) -> None:
    """A key in the provider's session keyring is out of every sandbox's reach."""
    assert NR is not None
    secret = f"sandrl-key-{uuid.uuid4().hex}".encode()
    libc = _libc()
    key = libc.syscall(NR["add_key"], b"user", b"sandrl-test", secret, len(secret), KEY_SPEC_SESSION_KEYRING)
    if key < 0:
        pytest.skip(f"this process cannot add a key to its session keyring (errno {ctypes.get_errno()})")
    script = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.syscall.restype = ctypes.c_long\n"
        "buf = ctypes.create_string_buffer(4096)\n"
        f"n = libc.syscall({NR['keyctl']}, {KEYCTL_READ}, {KEY_SPEC_SESSION_KEYRING}, buf, 4096)\n"
        "print('session', n, ctypes.get_errno())\n"
        f"n = libc.syscall({NR['keyctl']}, {KEYCTL_READ}, {key}, buf, 4096)\n"
        "print('key', n, ctypes.get_errno(), buf.raw[:max(n, 0)])\n"
    )
    async with await provider.create(SandboxSpec(ttl_s=60)) as sb:
        r = await sb.exec("python3 -; cat /proc/keys 2>&1", stdin=script.encode())
    assert secret.decode() not in r.stdout
    assert "session -1 1" in r.stdout, r.stdout  # EPERM: the filter refuses keyctl
    assert "key -1 1" in r.stdout, r.stdout
    assert "sandrl-test" not in r.stdout


@needs_known_arch
async def test_seccomp_refuses_dangerous_syscalls(sandbox: BwrapSandbox) -> None:
    assert NR is not None
    calls = {name: nr for name, nr in NR.items() if name not in ("add_key", "keyctl")}
    script = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"for name, nr in {calls!r}.items():\n"
        "    print(name, libc.syscall(nr, 0, 0, 0, 0, 0), ctypes.get_errno())\n"
    )
    r = await sandbox.exec("grep ^Seccomp: /proc/self/status; python3 -", stdin=script.encode())
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["Seccomp:", "2"]
    assert sorted(lines[1:]) == sorted(f"{name} -1 1" for name in calls)  # every one EPERM


async def test_seccomp_refuses_pid1_arguments_in_both_positions(sandbox: BwrapSandbox) -> None:
    """In a nested pid namespace pid 1 is the caller's own child, so only the filter can refuse:
    prlimit64 names the pid in argument 0, setpriority in argument 1; another pid is allowed."""
    r = await sandbox.exec(
        "unshare -r -p -f --kill-child sh -c '"
        "prlimit --pid 1 --nofile >/dev/null 2>&1; echo $?; renice -n 1 -p 1 >/dev/null 2>&1; echo $?; "
        "sleep 5 & prlimit --pid $! --nofile >/dev/null; echo $?; renice -n 1 -p $! >/dev/null; echo $?; kill $!'"
    )
    assert r.stdout.split() == ["1", "1", "0", "0"], (r.stdout, r.stderr)


async def test_host_facts_in_proc_read_as_empty(sandbox: BwrapSandbox) -> None:
    host_cmdline = Path("/proc/cmdline").read_text().strip()
    assert host_cmdline
    r = await sandbox.exec("cat /proc/cmdline /proc/sys/kernel/random/boot_id /proc/partitions; echo end")
    assert r.exit_code == 0, r.stderr
    assert r.stdout == "end\n"


async def test_host_side_processes_get_a_clean_environment(provider: BwrapProvider) -> None:
    """The server's token (or any secret in its environment) never reaches the helper or bubblewrap."""
    marker = f"sandrl-secret-{uuid.uuid4().hex}"
    os.environ["SANDRL_TOKEN_TEST"] = marker
    try:
        async with await provider.create(SandboxSpec(ttl_s=60)) as sb:
            environ = Path(f"/proc/{sb.host_pid}/environ").read_bytes()
            r = await sb.exec("cat /proc/1/environ | tr '\\0' '\\n'; env")
    finally:
        del os.environ["SANDRL_TOKEN_TEST"]
    assert environ, "bubblewrap's environment should be readable by root"
    assert marker.encode() not in environ
    assert marker not in r.stdout


async def test_nested_namespaces_work_but_not_a_fresh_proc(sandbox: BwrapSandbox) -> None:
    """What the /proc masks cost, stated in the threat model: nested namespaces work, a new /proc does not."""
    r = await sandbox.exec(
        "unshare -r -m sh -c 'mount -t tmpfs none /mnt && echo nested-mount'; "
        "unshare -r -p -f sh -c 'echo nested-pid'; "
        "unshare -r -p -f --mount-proc true 2>/dev/null || echo no-fresh-proc"
    )
    assert r.stdout.split() == ["nested-mount", "nested-pid", "no-fresh-proc"], r.stderr


async def test_dev_shm_is_open_to_every_user(sandbox: BwrapSandbox) -> None:
    """POSIX shared memory and semaphores work for the sandbox's root and its other users."""
    r = await sandbox.exec(
        "stat -c %a /dev/shm; echo a > /dev/shm/root-file && echo root-ok; "
        "su nobody -s /bin/sh -c 'echo b > /dev/shm/user-file && echo user-ok'; "
        "python3 -c 'import multiprocessing as m; m.Lock(); print(\"semaphore-ok\")'"
    )
    assert r.stdout.split() == ["1777", "root-ok", "user-ok", "semaphore-ok"], r.stderr


async def test_each_sandbox_has_its_own_working_loopback(provider: BwrapProvider) -> None:
    """The launcher's network namespace: loopback is up, and two sandboxes hold one port at once."""
    serve = (
        'python3 -c \'import socket, time; s = socket.socket(); s.bind(("127.0.0.1", 8765)); s.listen(); '
        'socket.create_connection(("127.0.0.1", 8765)); time.sleep(0.5); print("loopback-ok")\''
    )
    async with await provider.create(SandboxSpec(ttl_s=60)) as a, await provider.create(SandboxSpec(ttl_s=60)) as b:
        results = await asyncio.gather(a.exec(serve, timeout_s=10), b.exec(serve, timeout_s=10))
        assert [r.stdout.strip() for r in results] == ["loopback-ok", "loopback-ok"], [r.stderr for r in results]
        ns = [(await sb.exec("readlink /proc/self/ns/net")).stdout for sb in (a, b)]
        assert ns[0] != ns[1] and os.readlink("/proc/self/ns/net") not in ns


async def test_low_ports_and_ping_in_the_sandboxs_own_network(sandbox: BwrapSandbox) -> None:
    """The network namespace is the sandbox's: its root binds port 80 and opens ICMP sockets."""
    script = (
        "import socket\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 80)); print('bound 80')\n"
        "p = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); p.settimeout(2)\n"
        "p.sendto(bytes([8, 0, 0xF7, 0xFE, 0, 0, 0, 1]), ('127.0.0.1', 0))\n"
        "print('raw-icmp', len(p.recv(64)) > 0)\n"
    )
    r = await sandbox.exec("python3 -", stdin=script.encode())
    assert r.stdout.splitlines() == ["bound 80", "raw-icmp True"], (r.stdout, r.stderr)
