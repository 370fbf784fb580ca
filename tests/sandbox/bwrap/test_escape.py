"""Escape attempts, one per test: each must be contained."""

from __future__ import annotations

import asyncio
import os
import socket
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


@pytest.mark.parametrize("host_dir", ["/root", "/tmp"])
async def test_host_files_are_not_visible(sandbox: BwrapSandbox, host_dir: str) -> None:
    name = f"sandrl-planted-{uuid.uuid4().hex}"
    planted = Path(host_dir) / name
    planted.write_text("secret")
    try:
        r = await sandbox.exec(f"cat {planted}; find / -name {name} -print 2>/dev/null | head")
        assert "secret" not in r.stdout
        assert name not in r.stdout
    finally:
        planted.unlink()


async def test_project_checkout_is_not_visible(sandbox: BwrapSandbox) -> None:
    here = Path(__file__).resolve()
    r = await sandbox.exec(f"ls {here.parent}; cat {here}")
    assert r.exit_code != 0
    assert "Escape attempts" not in r.stdout


async def test_etc_shadow_is_hidden(sandbox: BwrapSandbox) -> None:
    r = await sandbox.exec("cat /etc/shadow /etc/gshadow; ls /etc/ssh 2>/dev/null | grep _key$")
    assert r.exit_code != 0
    assert "root:" not in r.stdout
    assert "_key" not in r.stdout
    # ...while the world-readable rest of /etc is there
    assert (await sandbox.exec("grep -c ^root: /etc/passwd")).stdout.strip() == "1"


async def test_host_processes_are_not_visible(sandbox: BwrapSandbox) -> None:
    r = await sandbox.exec("ls /proc | grep -E '^[0-9]+$' | sort -n")
    pids = [int(p) for p in r.stdout.split()]
    assert pids[0] == 1
    assert len(pids) < 10  # the agent, the shell and its pipeline
    r = await sandbox.exec(f"kill -0 {os.getpid()} 2>&1 || echo no-such-process")
    assert "no-such-process" in r.stdout or "No such process" in r.stdout


async def test_host_loopback_server_is_unreachable(sandbox: BwrapSandbox) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    try:
        client = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2); print('connected')"
        r = await sandbox.exec(f'python3 -c "{client}"')
        assert r.exit_code != 0
        assert "connected" not in r.stdout
    finally:
        server.close()


async def test_only_loopback_interface(sandbox: BwrapSandbox) -> None:
    r = await sandbox.exec("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; ls /sys/class/net 2>&1")
    assert r.stdout.split()[0] == "lo"
    assert "eth" not in r.stdout


async def test_mount_is_refused(sandbox: BwrapSandbox) -> None:
    r = await sandbox.exec("mount -t tmpfs none /mnt && echo mounted")
    assert "mounted" not in r.stdout
    assert r.exit_code != 0


async def test_unshare_gains_nothing(sandbox: BwrapSandbox) -> None:
    # Without a user namespace new namespaces need CAP_SYS_ADMIN, which the sandbox lacks.
    r = await sandbox.exec("unshare --mount --pid --fork true && echo escaped")
    assert "escaped" not in r.stdout
    # A nested user namespace is allowed, but it sees no more than the sandbox does.
    r = await sandbox.exec("unshare -r cat /etc/shadow; unshare -r ls /root")
    assert "root:" not in r.stdout


async def test_ptrace_of_host_pid_and_of_supervisor_fail(sandbox: BwrapSandbox) -> None:
    script = (
        "import ctypes, sys\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "for pid in (int(sys.argv[1]), 1):\n"
        "    r = libc.ptrace(16, pid, 0, 0)\n"  # PTRACE_ATTACH
        "    print(pid, r, ctypes.get_errno())\n"
    )
    await sandbox.write_file("/tmp/pt.py", script.encode())
    r = await sandbox.exec(f"python3 /tmp/pt.py {os.getpid()}")
    lines = dict(line.split(" ", 1) for line in r.stdout.strip().splitlines())
    assert lines[str(os.getpid())].startswith("-1 ")  # ESRCH: not even visible
    assert lines["1"].startswith("-1 ")  # EPERM: the supervisor is not dumpable


async def test_root_inside_is_not_root_outside(sandbox: BwrapSandbox, provider: BwrapProvider) -> None:
    r = await sandbox.exec("id -u; cat /proc/self/status | grep CapEff")
    assert r.stdout.splitlines()[0] == "0"
    host_uids = set()
    for pid in sandbox._group.processes():
        status = Path(f"/proc/{pid}/status").read_text()
        uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
        host_uids.add(int(uid_line.split()[1]))
    assert host_uids
    assert min(host_uids) >= provider.state.uid_base


async def test_image_writes_are_private(provider: BwrapProvider) -> None:
    name = f"evil-{uuid.uuid4().hex[:8]}"
    async with await provider.create(SandboxSpec()) as first, await provider.create(SandboxSpec()) as second:
        r = await first.exec(f"echo x > /usr/bin/{name} && echo y > /etc/{name} && echo ok")
        assert r.stdout.strip() == "ok"  # copy-on-write: the write succeeds...
        r = await second.exec(f"ls /usr/bin/{name} /etc/{name}")
        assert r.exit_code != 0  # ...but no other sandbox sees it
    assert not Path(f"/usr/bin/{name}").exists()  # and the image on disk is unchanged
    assert not Path(f"/etc/{name}").exists()


async def test_other_sandboxes_files_are_unreachable(provider: BwrapProvider) -> None:
    token = uuid.uuid4().hex
    async with await provider.create(SandboxSpec()) as first, await provider.create(SandboxSpec()) as second:
        await first.write_file(f"/workspace/{token}", b"mine")
        r = await second.exec(f"find / -name {token} 2>/dev/null; cat /proc/*/root/workspace/{token} 2>/dev/null")
        assert token not in r.stdout
        assert "mine" not in r.stdout


async def test_nothing_persists_after_close(provider: BwrapProvider) -> None:
    token = uuid.uuid4().hex
    sb = await provider.create(SandboxSpec())
    await sb.exec(f"echo {token} > /root/{token}; echo {token} > /etc/{token}")
    sid = sb.id
    await sb.close()
    async with await provider.create(SandboxSpec()) as again:
        r = await again.exec(f"cat /root/{token} /etc/{token}")
        assert token not in r.stdout
    assert not provider.state.record_dir(sid).exists()
    await asyncio.sleep(0)
