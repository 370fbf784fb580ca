"""The sandbox's pid 1 (its supervisor, the agent) is out of reach of the sandbox's own root.

Before the nested user namespace, pid 1 ran as the sandbox's root: ``prlimit --pid 1`` made every
later exec fail, ``--as=1`` killed it, and renice, taskset and ``oom_score_adj`` all worked. In
training that turns a failing episode into a retryable infra error: a reward hack.
"""

from __future__ import annotations

import os

import pytest

from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider, BwrapSandbox

from ...support import needs_sandbox

pytestmark = needs_sandbox

TAMPERING = {
    "nofile": "prlimit --pid 1 --nofile=5:5",
    "address space": "prlimit --pid 1 --as=1",
    "nice": "renice -n 10 -p 1",
    "affinity": "taskset -p 1 1",
    "oom score": "echo 1000 > /proc/1/oom_score_adj",
    "signal": "kill -STOP 1; kill -TERM 1; kill -KILL 1",
}


@pytest.mark.parametrize("what", sorted(TAMPERING))
async def test_pid1_cannot_be_tampered_with(sandbox: BwrapSandbox, what: str) -> None:
    before = (
        await sandbox.exec("cat /proc/1/limits /proc/1/oom_score_adj; grep -E '^Cpus_allowed' /proc/1/status")
    ).stdout
    r = await sandbox.exec(TAMPERING[what] + " 2>&1; echo rc=$?")
    assert "rc=0" not in r.stdout, r.stdout
    # pid 1 still serves, with the limits and scores it had
    after = await sandbox.exec("cat /proc/1/limits /proc/1/oom_score_adj; grep -E '^Cpus_allowed' /proc/1/status")
    assert after.exit_code == 0
    assert after.stdout == before
    assert (await sandbox.exec("echo still here")).stdout == "still here\n"


async def test_pid1_cannot_be_traced_or_read(sandbox: BwrapSandbox) -> None:
    script = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print('attach', libc.ptrace(16, 1, 0, 0), ctypes.get_errno())\n"  # PTRACE_ATTACH
        "for name in ('mem', 'environ', 'root/etc/hostname', 'fd/0'):\n"
        "    try:\n"
        "        open(f'/proc/1/{name}', 'rb').read(1)\n"
        "        print(name, 'open')\n"
        "    except OSError as exc:\n"
        "        print(name, 'refused', exc.errno)\n"
    )
    r = await sandbox.exec("python3 -", stdin=script.encode())
    assert r.exit_code == 0, r.stderr
    assert "attach -1" in r.stdout
    assert " open" not in r.stdout, r.stdout


async def test_root_keeps_its_own_powers(sandbox: BwrapSandbox) -> None:
    """The nested namespace takes nothing a container's root normally has over its own world."""
    r = await sandbox.exec(
        "id -u; touch /etc/written && chown 1000:1000 /etc/written && stat -c '%u %g' /etc/written;"
        'python3 -c \'import socket; s = socket.socket(); s.bind(("127.0.0.1", 80)); print("port 80")\';'
        "sleep 30 & kill -9 $! && echo killed-own; prlimit --pid $$ --nofile=64:64 && echo own-limit"
    )
    assert r.exit_code == 0, r.stderr
    assert r.stdout.split("\n")[:5] == ["0", "1000 1000", "port 80", "killed-own", "own-limit"]


async def test_commands_get_dockers_capabilities_at_most(sandbox: BwrapSandbox) -> None:
    """Entering the nested namespace resets the bounding set to all; the agent cuts it back to its own."""
    docker_default = 0xA80425FB  # CHOWN DAC_OVERRIDE FOWNER FSETID KILL SETGID SETUID SETPCAP
    # NET_BIND_SERVICE NET_RAW SYS_CHROOT MKNOD AUDIT_WRITE SETFCAP
    r = await sandbox.exec("grep -E '^Cap(Bnd|Eff):' /proc/self/status")
    caps = {line.split(":")[0]: int(line.split()[1], 16) for line in r.stdout.splitlines()}
    assert caps == {"CapBnd": docker_default, "CapEff": docker_default}, r.stdout


async def test_pid1_holds_only_its_own_fds(either_launch: BwrapProvider) -> None:
    """The agent closes every fd it did not ask for (close_range over the gaps between the ones it
    keeps): nothing of the launcher's (its layers, its sockets) stays open in pid 1."""
    async with await either_launch.create(SandboxSpec(ttl_s=60)) as sandbox:
        with open(f"/proc/{sandbox.host_pid}/task/{sandbox.host_pid}/children") as f:
            # pid 1 in its namespace; the monitor's short-lived helpers of a launch may still be exiting
            children = [c for c in f.read().split() if _pid_in_its_namespace(c) == "1"]
        assert len(children) == 1  # the monitor's one lasting child: pid 1
        fd_dir = f"/proc/{children[0]}/fd"
        targets = sorted(os.readlink(f"{fd_dir}/{fd}") for fd in os.listdir(fd_dir))
    kinds = [t.split(":[")[0] if ":[" in t else ("slot lock" if t.endswith(".lock") else t) for t in targets]
    assert sorted(kinds) == sorted(["/dev/null"] * 3 + ["user", "anon_inode", "slot lock", "socket"]), targets


def _pid_in_its_namespace(pid: str) -> str | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((line.split()[-1] for line in f if line.startswith("NSpid:")), None)
    except OSError:  # exited meanwhile
        return None
