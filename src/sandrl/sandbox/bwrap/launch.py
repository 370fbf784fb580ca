"""Starting a sandbox's helper: the blocking host work of a create, whole or in two halves.

A launch locks a uid slot, writes the sandbox's record, makes its cgroups and starts
``sandrl-helper launch``, which makes the namespaces, builds the root and makes pid 1 itself:
pid, mount, ipc, uts and cgroup namespaces, bubblewrap's /proc (with our masks, which show one
read-only file of the launcher's: :func:`empty_file_mount`) and /dev (a directory of the sandbox's
disk tmpfs), the root handed to pid 1 as a detached mount and pivoted into (see
``native/sandrl-helper.c``).
:meth:`Launcher.launch` does it in one go. A *pre-made* launch (:meth:`Launcher.premake`, then
:meth:`Launcher.finish`) does everything that does not depend on the image ahead of demand:
slot, record, cgroups with their limits, the helper's process, every namespace, and pid 1 with
/proc and /dev/pts; pid 1 then waits for its root. When it is taken, the record completes and the
rest of the helper's arguments (the image's layers, the disk size, pid 1's command line) go over
the socket; the helper builds the root and hands it to pid 1, which pivots into it and runs the
agent. Blocking throughout: run it in a thread.

Which program makes a full launch's pid 1 is the provider's ``launcher`` (:data:`LAUNCHERS`):
``"helper"`` (the default: the helper, as above) or ``"bubblewrap"`` (the helper builds the root
and execs bubblewrap, which makes the pid, ipc, uts and cgroup namespaces, /proc, /dev and pid 1:
for a host that needs it, e.g. a security module's policy that lets bubblewrap make namespaces
and mounts but not the helper; a launch made ahead always uses the helper). ``$SANDRL_LAUNCHER``
sets it where the provider is not made in code.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import socket
import struct
import subprocess
import threading
import time
import uuid
import weakref
from dataclasses import dataclass
from pathlib import Path

from sandrl.errors import SandboxUnavailableError
from sandrl.images.manifest import DEFAULT_PATH
from sandrl.processes import reap_in_background
from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap.cgroups import CgroupManager, SandboxCgroup
from sandrl.sandbox.bwrap.images import MountPlan
from sandrl.sandbox.bwrap.state import STORE_UID_BASE, Slot, StateDir

# Docker's default capability set: what root in a container normally has.
DEFAULT_CAPS = (
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
)
_MASKED_PROC = (
    "/proc/cmdline",
    "/proc/partitions",
    "/proc/diskstats",
    "/proc/sys/kernel/random/boot_id",
    "/proc/sched_debug",
    "/proc/latency_stats",
)
"""Host facts under /proc that a sandbox has no use for, read as empty (after Docker's masked paths;
its others are unreadable here anyway: ``kcore`` and ``timer_list`` are host root's, ``keys`` and
``key-users`` list only the sandbox's own keyring and users)."""
_HELPER_ENV = {"PATH": DEFAULT_PATH, "LANG": "C.UTF-8"}
"""The whole environment of the host-side helper and bubblewrap: never the server's (its token)."""
LAUNCHERS = ("helper", "bubblewrap")
"""What may make a full launch's pid 1 (the module's docstring): the first is the default."""
LAUNCHER_ENV = "SANDRL_LAUNCHER"
"""Names the launcher where the provider is not given one."""

# The new mount API (the same numbers on every architecture, as every syscall from 424 on).
_SYS_FSOPEN, _SYS_FSCONFIG, _SYS_FSMOUNT, _SYS_MOUNT_SETATTR = 430, 431, 432, 442
_FSCONFIG_SET_STRING, _FSCONFIG_CMD_CREATE = 1, 6
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_NOSUID, _MOUNT_ATTR_NODEV, _MOUNT_ATTR_NOEXEC = 0x1, 0x2, 0x4, 0x8
_AT_EMPTY_PATH = 0x1000
_FSOPEN_CLOEXEC = _FSMOUNT_CLOEXEC = 0x1


def _mount_api(nr: int, *args: object) -> int:
    ret = int(_libc().syscall(ctypes.c_long(nr), *args))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ret


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def empty_file_mount() -> int:
    """A detached, read-only tmpfs (source "sandrl", in no mount table) holding one empty file,
    ``empty``: what the /proc entries the helper's pid 1 masks show (``--mask-fd``), for every
    sandbox of a provider. A tmpfs per sandbox (bubblewrap's masks show the sandbox's own) costs the
    host more than its pages: every filesystem instance adds a slot to the shrinker map the kernel
    keeps for each memory cgroup, so N sandboxes of k instances each cost N x kN slots (~16 bytes
    each): 1.4 MiB a sandbox at 10,000 live with 9 instances each. Nothing of a sandbox can change
    it: read-only, and its file and directory are host root's, whom no sandbox's namespace maps."""
    fs = _mount_api(_SYS_FSOPEN, b"tmpfs", ctypes.c_uint(_FSOPEN_CLOEXEC))
    try:
        for key, value in ((b"source", b"sandrl"), (b"size", b"4k"), (b"nr_inodes", b"2"), (b"mode", b"0755")):
            _mount_api(_SYS_FSCONFIG, fs, _FSCONFIG_SET_STRING, key, value, 0)
        _mount_api(_SYS_FSCONFIG, fs, _FSCONFIG_CMD_CREATE, None, None, 0)
        flags = _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV | _MOUNT_ATTR_NOEXEC
        mnt = _mount_api(_SYS_FSMOUNT, fs, ctypes.c_uint(_FSMOUNT_CLOEXEC), flags)
    finally:
        os.close(fs)
    try:
        os.close(os.open("empty", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o444, dir_fd=mnt))
        attr = struct.pack("<QQQQ", _MOUNT_ATTR_RDONLY, 0, 0, 0)
        _mount_api(_SYS_MOUNT_SETATTR, mnt, b"", _AT_EMPTY_PATH, attr, len(attr))
    except BaseException:
        os.close(mnt)
        raise
    return mnt


@dataclass(frozen=True)
class PremadeKind:
    """What a pre-made launch is made for: everything of a sandbox that is fixed before its image
    (its cgroup limits; a sandbox's network is added after its launch, :mod:`.nat`)."""

    memory_mb: int | None
    pids: int | None
    cpus: float | None

    @staticmethod
    def of(spec: SandboxSpec) -> PremadeKind:
        return PremadeKind(spec.memory_mb, spec.pids, spec.cpus)


@dataclass
class Launch:
    """What a launch made of a sandbox before its agent answered."""

    sid: str
    state: StateDir
    slot: Slot
    record: Path
    cpus: frozenset[int]
    group: SandboxCgroup | None = None
    proc: subprocess.Popen[bytes] | None = None
    sock: socket.socket | None = None
    """The provider's end of the agent's socket, until the connection takes it."""
    helper_sock_fd: int = -1
    """The helper's end of that socket, as the helper numbers it (the same number as it had here)."""
    slot_fd: int = -1
    """The slot's lock, as the helper numbers it."""
    mask_fd: int = -1
    """The launcher's :func:`empty_file_mount`, passed to a helper that makes pid 1 (the same number there)."""
    premade: bool = False
    """Made ahead, waiting for the rest of its arguments (:meth:`Launcher.finish`)."""
    helper_fd_open: bool = False
    """The helper's end of the socket is still open here (the helper has not been started with it)."""

    def undo(self) -> None:
        """Kill what started and remove every trace (blocking): the create failed or was cancelled,
        or a pre-made launch is not needed any more."""
        if self.sock is not None:
            self.sock.close()  # a pre-made helper waiting for its arguments exits on this EOF
            self.sock = None
        if self.helper_fd_open:
            os.close(self.helper_sock_fd)
            self.helper_fd_open = False
        if self.group is not None:
            self.group.kill()
        if self.proc is not None:
            with contextlib.suppress(Exception):
                self.proc.kill()
                self.proc.wait(timeout=5)
        # A group still not removable keeps its record, so that the next reaper (and `sandrl sandbox
        # ls`) sees a dead sandbox, not a stray group nobody names.
        removed = self.group is None or self.group.remove()
        if self.proc is not None:
            reap_in_background(self.proc)
        if removed:
            self.state.remove_record(self.sid)
        self.slot.release()


@functools.cache
def _masked_proc() -> tuple[str, ...]:
    """Those of :data:`_MASKED_PROC` this kernel has (the sandbox's /proc shows the same kernel's entries as ours)."""
    return tuple(path for path in _MASKED_PROC if os.path.exists(path))


class Launcher:
    """Launches sandboxes of one provider: its state directory, cgroups and helper; ``bwrap`` is
    bubblewrap's path where a full launch runs it (``launcher="bubblewrap"``), else None."""

    def __init__(self, state: StateDir, cgroups: CgroupManager, helper: Path, bwrap: str | None, identity: str) -> None:
        self.state = state
        self.cgroups = cgroups
        self.helper = helper
        self.bwrap = bwrap
        self.identity = identity
        self._mask_fd = -1
        self._mask_lock = threading.Lock()
        self.times = False
        """Helpers started from now on write their steps' times on their log (``--times``), which
        ``sandrl bench sandbox`` reads to split a cold create (:mod:`sandrl.bench.cold_split`)."""

    def _mask_source(self) -> int:
        """:func:`empty_file_mount`'s fd, made on first use and closed with this launcher."""
        with self._mask_lock:
            if self._mask_fd < 0:
                try:
                    self._mask_fd = empty_file_mount()
                except OSError as exc:
                    raise SandboxUnavailableError(
                        f"this kernel refused a detached tmpfs (fsopen, fsmount: Linux 5.2 or later): {exc}; "
                        f'use launcher="bubblewrap" (${LAUNCHER_ENV}=bubblewrap)'
                    ) from exc
                weakref.finalize(self, os.close, self._mask_fd)
            return self._mask_fd

    def launch(self, sid: str, spec: SandboxSpec, plan: MountPlan, cpus: set[int]) -> Launch:
        """Lock a slot, write the record, make the cgroups and start the helper; on failure, what
        it made is undone before it raises."""
        launch = self._begin(sid, cpus)
        try:
            self._write_record(launch, spec)
            launch.group = self.cgroups.create(sid, memory_mb=spec.memory_mb, pids=spec.pids, cpus=spec.cpus)
            argv = [*self._head(launch), *self._root(launch, spec, plan)]
            if self.bwrap is not None:
                argv += ["--bwrap", self.bwrap, "--", *self._bwrap(launch), "--", *self._agent(launch, spec)]
            else:  # the helper makes pid 1, as for a launch made ahead but with every argument now
                argv += ["--sock-fd", str(launch.helper_sock_fd), *self._pid1(launch), "--"]
                argv += self._agent(launch, spec)
            self._start(launch, argv)
            return launch
        except BaseException:
            launch.undo()
            raise

    def premake(self, kind: PremadeKind, cpus: set[int]) -> Launch:
        """The first half of a launch, for a sandbox of ``kind`` whose image is not known yet: its
        cgroups with their limits, and a helper that makes every namespace and then waits for
        :meth:`finish`."""
        launch = self._begin("sb-" + uuid.uuid4().hex[:12], cpus)
        launch.premade = True
        try:
            self._write_record(launch, None)
            launch.group = self.cgroups.create(launch.sid, memory_mb=kind.memory_mb, pids=kind.pids, cpus=kind.cpus)
            head = self._head(launch)
            head += ["--store-uid", str(STORE_UID_BASE), "--args-fd", str(launch.helper_sock_fd)]
            self._start(launch, [*head, *self._pid1(launch)])
            return launch
        except BaseException:
            launch.undo()
            raise

    def finish(self, launch: Launch, spec: SandboxSpec, plan: MountPlan) -> Launch:
        """Make a pre-made launch of ``spec``'s kind (:meth:`PremadeKind.of`) the sandbox of
        ``spec``: its record, and the helper's other arguments; on failure the launch is undone
        before this raises."""
        assert launch.premade and launch.sock is not None and launch.group is not None
        try:
            tail = [*self._root(launch, spec, plan), "--", *self._agent(launch, spec)]
            bad = [arg for arg in tail if "\0" in arg]
            if bad:  # each would split into more arguments (Popen refuses them too)
                raise ValueError(f"a launch argument holds a NUL byte: {bad!r}")
            self._write_record(launch, spec)
            payload = b"".join(arg.encode() + b"\0" for arg in tail)
            launch.sock.setblocking(True)
            launch.sock.sendall(struct.pack("<I", len(payload)) + payload)
            launch.sock.setblocking(False)
            launch.premade = False
            return launch
        except BaseException:
            launch.undo()
            raise

    # -- the parts

    def _begin(self, sid: str, cpus: set[int]) -> Launch:
        slot = self.state.acquire_slot()
        launch = Launch(sid, self.state, slot, self.state.record_dir(sid), frozenset(cpus))
        try:
            self.state.claim(slot, sid)
        except BaseException:
            slot.release()
            raise
        return launch

    def _write_record(self, launch: Launch, spec: SandboxSpec | None) -> None:
        meta: dict[str, object] = {
            "id": launch.sid,
            "slot": launch.slot.index,
            "uid": launch.slot.uid,
            "spec": spec.to_dict() if spec is not None else None,
            "created": time.time(),
            "provider": self.identity,
        }
        if spec is None:
            meta["premade"] = True  # no sandbox yet: its helper waits to be given one
        # A pre-made launch being finished has its record: the new one replaces it.
        self.state.write_record(launch.sid, meta, replace=spec is not None and launch.premade)

    def _head(self, launch: Launch) -> list[str]:
        """The helper's arguments that do not depend on the sandbox."""
        assert launch.group is not None
        launch.sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        launch.helper_sock_fd = child_sock.detach()
        launch.helper_fd_open = True
        launch.slot_fd = launch.slot.fd
        argv = [str(self.helper), "launch", "--uid", str(launch.slot.uid), *(["--times"] if self.times else [])]
        for procs in launch.group.procs_files:
            argv += ["--cgroup-procs", str(procs)]
        return argv

    def _root(self, launch: Launch, spec: SandboxSpec, plan: MountPlan) -> list[str]:
        """The helper's arguments for this sandbox's root: its disk, its image's layers."""
        argv = ["--tmpfs-bytes", str(spec.disk_mb << 20)]
        store_layers = plan.store_layers
        if store_layers and not launch.premade:
            argv += ["--store-uid", str(STORE_UID_BASE)]  # a pre-made launch was given it up front
        for i, layer in enumerate(plan.layers):
            kind = "--store-layer" if i in store_layers else "--host-layer" if i in plan.host_views else "--layer"
            argv += [kind, str(layer)]
        for target, indices in plan.overlays:
            argv += ["--overlay", target, ",".join(str(i) for i in indices)]
        return argv

    def _pid1(self, launch: Launch) -> list[str]:
        """What the helper needs to make pid 1 itself as bubblewrap would with :meth:`_bwrap`'s
        arguments (its hostname, the /proc entries masked; the rest is fixed in the helper)."""
        argv = ["--hostname", launch.sid]
        for path in _masked_proc():
            argv += ["--mask", path]
        launch.mask_fd = self._mask_source()
        return [*argv, "--mask-fd", str(launch.mask_fd)]

    def _bwrap(self, launch: Launch) -> list[str]:
        """bubblewrap's arguments (a full launch's with ``launcher="bubblewrap"``; the helper does
        the same itself otherwise)."""
        argv = ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup"]
        argv += ["--hostname", launch.sid, "--bind", "/tmp/sandrl/root", "/", "--proc", "/proc", "--dev", "/dev"]
        # bubblewrap makes /dev as pid 1's uid, which the sandbox's root is not: /dev/shm (POSIX
        # semaphores, shared memory) must be open to it, as /tmp is. A chmod, not a tmpfs of its
        # own: a new superblock per sandbox costs ~0.5 ms, and /dev's tmpfs is bounded the same
        # way (by the memory cgroup its pages are charged to).
        argv += ["--chmod", "1777", "/dev/shm"]
        for path in _masked_proc():
            argv += ["--ro-bind", "/tmp/sandrl/empty", path]
        argv += ["--as-pid-1", "--new-session", "--clearenv"]
        for cap in DEFAULT_CAPS:
            argv += ["--cap-add", cap]
        return argv

    def _agent(self, launch: Launch, spec: SandboxSpec) -> list[str]:
        """Pid 1's command line (the helper puts in the agent's file and the inner namespace's fd)."""
        ttl_ms = max(1, min(int(spec.ttl_s * 1000), 0xFFFFFFFF))
        argv = ["@AGENT@", "agent", "--fd", str(launch.helper_sock_fd), "--lock-fd", str(launch.slot_fd)]
        argv += ["--inner-userns", "@INNER_USERNS@", "--workdir", spec.workdir, "--ttl-ms", str(ttl_ms)]
        return argv

    def _start(self, launch: Launch, argv: list[str]) -> None:
        """Start the helper with ``argv``; its end of the socket is closed here once it has it."""
        try:
            os.set_inheritable(launch.helper_sock_fd, True)
            os.set_inheritable(launch.slot.fd, True)
            passed = (launch.helper_sock_fd, launch.slot.fd, *([launch.mask_fd] if launch.mask_fd >= 0 else []))
            if os.sched_getaffinity(0) != launch.cpus:  # e.g. a benchmark's emulated smaller host (bench.hostlimit)
                os.sched_setaffinity(0, launch.cpus)
            with open(launch.record / "log", "wb") as log:
                launch.proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    pass_fds=passed,
                    close_fds=True,
                    env=_HELPER_ENV,
                )
            if not launch.premade:
                assert launch.sock is not None
                launch.sock.setblocking(False)
        finally:
            os.close(launch.helper_sock_fd)
            launch.helper_fd_open = False
