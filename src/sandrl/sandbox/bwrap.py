"""The default sandbox backend: bubblewrap namespaces, an idmapped copy-on-write root, cgroups.

How one sandbox is made (``native/sandrl-helper.c`` does the privileged part, as root):

1. A uid *slot* is locked (:mod:`sandrl.sandbox.state`): sandbox root is an unprivileged host
   uid range of its own, so root inside is nobody outside and no two sandboxes share a uid.
2. Its cgroups are made with the spec's memory, pids and CPU limits (:mod:`.cgroups`).
3. The helper joins them, makes a user namespace mapping 0-65535 to the slot's range, and in a
   private mount namespace mounts the image's layers idmapped and read-only, with overlayfs
   over a tmpfs of ``disk_mb`` on top: the sandbox may write anywhere, the image never changes,
   and the writable layer vanishes with the namespace.
4. bubblewrap, run as the slot's uid inside that user namespace, adds pid, ipc, uts, cgroup and
   (unless ``network=True``) network namespaces, ``/proc`` and a minimal ``/dev``, keeps a
   Docker-like default set of capabilities (no ``CAP_SYS_ADMIN``, ``CAP_SYS_PTRACE``,
   ``CAP_NET_ADMIN``...), and starts the agent as pid 1.
5. The agent serves execs and file transfers over a socket until the provider closes it or
   dies, or the TTL passes; then pid 1 exits and the kernel kills everything left.

Threat model. Protects the host and other sandboxes from code run inside: no host files but
the read-only image (no secrets from ``/etc``), no host processes, no host network (by
default), no host uid, no privileges over the host's mounts, bounded memory, pids, CPU,
disk, output and time. It does **not** protect against kernel vulnerabilities: the sandbox
shares the host kernel and may create nested user namespaces, which widens the kernel's
attack surface (use a microVM backend for untrusted code where kernel bugs matter); no
seccomp filter is applied. ``network=True`` shares the host's network namespace, loopback
services included. CPU is a quota, not a pin: caches and memory bandwidth are shared, and
timing side channels between sandboxes are not addressed. The writable layer lives in memory
and counts against ``memory_mb``.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import resource
import shutil
import signal
import socket
import subprocess
import time
import uuid
import warnings
import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal

from sandrl.errors import (
    CapacityExhaustedError,
    LimitUnsupportedError,
    SandboxClosedError,
    SandboxCreateError,
    SandboxError,
    SandboxFileError,
    SandboxUnavailableError,
)
from sandrl.sandbox import protocol
from sandrl.sandbox.base import DEFAULT_OUTPUT_CAP, ExecResult, OutputChunk, SandboxSpec, validate_env
from sandrl.sandbox.cgroups import CgroupManager, SandboxCgroup
from sandrl.sandbox.helper import helper_path
from sandrl.sandbox.images import ImageStore, MountPlan
from sandrl.sandbox.protocol import AgentConnection, Frame, Op
from sandrl.sandbox.state import Slot, StateDir

DEFAULT_STATE_DIR = Path(os.environ.get("SANDRL_STATE_DIR", "/var/lib/sandrl"))
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
START_TIMEOUT_S = 15.0
EXEC_GRACE_S = 10.0
"""How long past a command's timeout the provider waits for the agent before giving up on it."""
READ_WINDOW = 4 << 20


@dataclass(frozen=True)
class SandboxStats:
    memory_bytes: int
    kernel_memory_bytes: int
    memory_peak_bytes: int
    cpu_s: float
    pids: int
    oom_kills: int


class BwrapProvider:
    """Makes :class:`BwrapSandbox` es on this host. Needs root, bubblewrap and cgroups."""

    def __init__(
        self,
        state_dir: Path | str | None = None,
        *,
        output_cap: int = DEFAULT_OUTPUT_CAP,
        max_live: int | None = None,
        min_free_memory_mb: int = 256,
        bwrap: str | None = None,
        cgroup_root: Path = Path("/sys/fs/cgroup"),
    ) -> None:
        if os.geteuid() != 0:
            raise SandboxUnavailableError(
                "the bubblewrap sandbox backend must run as root (it sets up idmapped mounts and cgroups, "
                "and then runs every sandbox as an unprivileged uid); run as root, or use a sandbox service "
                "(`sandrl serve sandboxes`) on a host where you can"
            )
        found = bwrap or shutil.which("bwrap")
        if found is None or not os.access(found, os.X_OK):
            raise SandboxUnavailableError(
                "bubblewrap is not installed: install it (Debian: apt-get install bubblewrap) "
                "or run scripts/bootstrap.sh"
            )
        self.bwrap = found
        _raise_fd_limit()  # one socket per live sandbox: hundreds at once
        self.state = StateDir(Path(state_dir) if state_dir is not None else DEFAULT_STATE_DIR)
        self.images = ImageStore(self.state.root / "images")
        self.helper = helper_path(self.state.root / "bin")
        self.cgroups = CgroupManager(root=cgroup_root, subdir=f"sandrl/{self.state.cgroup_name}")
        self._cgroup_missing = self.cgroups.missing()
        if len(self._cgroup_missing) < 3:
            self.cgroups.prepare()
        self.output_cap = output_cap
        self.max_live = max_live
        self.min_free_memory_mb = min_free_memory_mb
        self.live: set[BwrapSandbox] = set()
        self._creating = 0
        self.reaped = self.reap()
        _LIVE_PROVIDERS.add(self)

    # -- reaping

    def reap(self) -> list[str]:
        """Remove what dead sandboxes left (records, cgroups); return their ids."""
        dead = self.state.dead_records()
        for sid in dead:
            for d in self.cgroups.stale_groups().get(sid, []):
                _remove_group_dir(d)
            self.state.remove_record(sid)
        records = set(self.state.records())
        for name, dirs in self.cgroups.stale_groups().items():
            if name not in records:
                for d in dirs:
                    _remove_group_dir(d)
                dead.append(name)
        return sorted(set(dead))

    # -- creating

    def _check_spec(self, spec: SandboxSpec) -> None:
        if self._cgroup_missing:
            what = ", ".join(self._cgroup_missing)
            if spec.require_limits:
                raise LimitUnsupportedError(
                    f"this host cannot enforce the {what} limit(s) (no such cgroup controller under "
                    f"{self.cgroups.root}); enable the controller, or create with require_limits=False "
                    "to run without them"
                )
            warnings.warn(f"sandbox runs without {what} limits: this host has no such cgroup controller", stacklevel=3)

    def _admit(self) -> None:
        live = len(self.live) + self._creating
        if self.max_live is not None and live >= self.max_live:
            raise CapacityExhaustedError(
                f"{live} sandboxes are live, the limit of this provider (max_live={self.max_live}); "
                "close some or raise max_live"
            )
        free_mb = _mem_available_mb()
        if free_mb is not None and free_mb < self.min_free_memory_mb:
            raise CapacityExhaustedError(
                f"the host has {free_mb} MiB of memory available, under the {self.min_free_memory_mb} MiB "
                "reserve: close sandboxes or wait"
            )

    async def create(self, spec: SandboxSpec | None = None) -> BwrapSandbox:
        spec = spec or SandboxSpec()
        self._check_spec(spec)
        image = self.images.get(spec.image)
        self._admit()
        self._creating += 1
        try:
            return await self._create(spec, image.env, image.plan)
        finally:
            self._creating -= 1

    async def _create(self, spec: SandboxSpec, image_env: dict[str, str], plan: MountPlan) -> BwrapSandbox:
        sid = "sb-" + uuid.uuid4().hex[:12]
        slot = self.state.acquire_slot()
        group: SandboxCgroup | None = None
        proc: subprocess.Popen[bytes] | None = None
        conn: AgentConnection | None = None
        parent_sock = child_sock = None
        try:
            self.state.claim(slot, sid)
            record = self.state.write_record(
                sid, {"id": sid, "slot": slot.index, "uid": slot.uid, "spec": spec.to_dict(), "created": time.time()}
            )
            group = self.cgroups.create(sid, memory_mb=spec.memory_mb, pids=spec.pids, cpus=spec.cpus)
            parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            child_sock.set_inheritable(True)
            os.set_inheritable(slot.fd, True)
            argv = self._argv(sid, spec, slot, group, plan, child_sock.fileno())
            with open(record / "log", "wb") as log:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    pass_fds=(child_sock.fileno(), slot.fd),
                    close_fds=True,
                )
            child_sock.close()
            child_sock = None
            parent_sock.setblocking(False)
            reader, writer = await asyncio.open_unix_connection(sock=parent_sock, limit=1 << 20)
            parent_sock = None
            conn = AgentConnection(reader, writer)
            conn.start()
            try:
                version = await asyncio.wait_for(asyncio.shield(conn.hello), START_TIMEOUT_S)
            except (ConnectionError, TimeoutError) as exc:
                detail = (record / "log").read_text(errors="replace").strip() or str(exc) or "no output"
                raise SandboxCreateError(f"sandbox {sid} did not start: {detail}") from exc
            if version != protocol.PROTOCOL_VERSION:
                raise SandboxCreateError(
                    f"sandbox helper speaks protocol {version}, sandrl {protocol.PROTOCOL_VERSION}"
                )
        except BaseException:
            if conn is not None:
                await conn.close()
            for s in (parent_sock, child_sock):
                if s is not None:
                    s.close()
            if group is not None:
                group.kill()
            if proc is not None:
                with contextlib.suppress(Exception):
                    proc.kill()
                    proc.wait(timeout=5)
            if group is not None:
                group.remove()
            self.state.remove_record(sid)
            slot.release()
            raise
        # The sandbox's own processes now hold the slot's lock; ours would outlive a crash of theirs.
        slot.release()
        sandbox = BwrapSandbox(self, sid, spec, image_env, slot.index, group, proc, conn)
        sandbox.uid = slot.uid
        sandbox.mount_plan = plan
        self.live.add(sandbox)
        return sandbox

    def _argv(
        self, sid: str, spec: SandboxSpec, slot: Slot, group: SandboxCgroup, plan: MountPlan, sock_fd: int
    ) -> list[str]:
        argv = [str(self.helper), "launch", "--uid", str(slot.uid), "--tmpfs-bytes", str(spec.disk_mb << 20)]
        for procs in group.procs_files:
            argv += ["--cgroup-procs", str(procs)]
        for layer in plan.layers:
            argv += ["--layer", str(layer)]
        for target, indices in plan.overlays:
            argv += ["--overlay", target, ",".join(str(i) for i in indices)]
        argv += ["--bwrap", self.bwrap, "--"]
        argv += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup"]
        if not spec.network:
            argv.append("--unshare-net")
        argv += ["--hostname", sid, "--bind", "/tmp/sandrl/root", "/", "--proc", "/proc", "--dev", "/dev"]
        argv += ["--as-pid-1", "--new-session", "--clearenv"]
        for cap in DEFAULT_CAPS:
            argv += ["--cap-add", cap]
        ttl_ms = max(1, min(int(spec.ttl_s * 1000), 0xFFFFFFFF))
        argv += ["--", "@AGENT@", "agent", "--fd", str(sock_fd), "--lock-fd", str(slot.fd)]
        argv += ["--workdir", spec.workdir, "--ttl-ms", str(ttl_ms)]
        return argv

    async def close_all(self) -> None:
        await asyncio.gather(*(s.close() for s in list(self.live)), return_exceptions=True)

    def _close_all_sync(self) -> None:
        """Last resort at interpreter exit: kill and clean up without an event loop."""
        for sandbox in list(self.live):
            sandbox._cleanup_sync()


class BwrapSandbox:
    """One live sandbox made by :class:`BwrapProvider`."""

    def __init__(
        self,
        provider: BwrapProvider,
        sid: str,
        spec: SandboxSpec,
        image_env: dict[str, str],
        slot_index: int,
        group: SandboxCgroup,
        proc: subprocess.Popen[bytes],
        conn: AgentConnection,
    ) -> None:
        self.id = sid
        self.spec = spec
        self.provider = provider
        self.slot_index = slot_index
        self.created_at = time.time()
        self.expires_at = self.created_at + spec.ttl_s
        self._group = group
        self._proc = proc
        self._conn = conn
        self._base_env = {
            "PATH": image_env.get("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
            "HOME": "/root",
            "USER": "root",
            "LOGNAME": "root",
            "HOSTNAME": sid,
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            **image_env,
            **spec.env,
        }
        self._closing: asyncio.Task[None] | None = None
        self._close_callbacks: list[Callable[[BwrapSandbox], None]] = []
        self.close_reason = ""
        loop = asyncio.get_running_loop()
        self._ttl_timer = loop.call_later(spec.ttl_s, self._expire)
        self._watch = asyncio.create_task(self._watch_death(), name=f"sandrl-watch-{sid}")

    uid: int = 0
    """Host uid of root inside the sandbox (inside uid n is host uid ``uid + n``)."""
    mount_plan: MountPlan | None = None
    """The image layers and overlays this sandbox was made from."""

    @property
    def host_pid(self) -> int:
        """Host pid of the sandbox's outermost process; its mount namespace holds the writable layers,
        at ``/tmp/sandrl/upper/<k>`` for the k-th overlay of :attr:`mount_plan` (``/`` first)."""
        return self._proc.pid

    # -- lifecycle

    @property
    def closed(self) -> bool:
        return self._closing is not None

    async def _watch_death(self) -> None:
        await self._conn.closed.wait()
        if self._closing is None:
            self.close_reason = self._conn.close_reason
            self._start_close()

    def _expire(self) -> None:
        if self._closing is None:
            self.close_reason = f"its TTL of {self.spec.ttl_s:g} s expired"
            self._start_close()

    def _start_close(self) -> asyncio.Task[None]:
        if self._closing is None:
            self._closing = asyncio.get_running_loop().create_task(self._cleanup(), name=f"sandrl-close-{self.id}")
        return self._closing

    async def close(self) -> None:
        """Kill everything in the sandbox and remove every trace of it; safe to call twice."""
        if not self.close_reason:
            self.close_reason = "it was closed"
        # Shielded: a cancelled caller must not leave a half-removed sandbox behind.
        await asyncio.shield(self._start_close())

    async def _cleanup(self) -> None:
        self._ttl_timer.cancel()
        # Closing the socket makes the agent (pid 1) exit, which kills and reaps everything in its
        # pid namespace; bubblewrap's monitor exits only after that, so once it has exited no
        # process of the sandbox is left. SIGKILL through the cgroup is the fallback.
        await self._conn.close()
        deadline = time.monotonic() + 2
        while self._proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.002)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self._proc.poll() is not None and not self._group.processes():
                break
            self._group.kill()
            await asyncio.sleep(0.002)
        self._finish_cleanup()
        if self._watch is not asyncio.current_task():
            self._watch.cancel()

    def _finish_cleanup(self) -> None:
        with contextlib.suppress(Exception):
            self._proc.wait(timeout=1)
        self._group.remove()
        self.provider.state.remove_record(self.id)
        self.provider.live.discard(self)
        callbacks, self._close_callbacks = self._close_callbacks, []
        for callback in callbacks:
            callback(self)

    def add_close_callback(self, callback: Callable[[BwrapSandbox], None]) -> None:
        """Call ``callback(sandbox)`` once the sandbox is gone (closed, expired or died)."""
        if self._closing is not None and self._closing.done():
            callback(self)
        else:
            self._close_callbacks.append(callback)

    def _cleanup_sync(self) -> None:
        self._group.kill()
        with contextlib.suppress(Exception):
            self._proc.kill()
        self._finish_cleanup()

    async def __aenter__(self) -> BwrapSandbox:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def _check_open(self) -> None:
        if self._closing is not None or self._conn.closed.is_set():
            raise SandboxClosedError(f"sandbox {self.id} is closed: {self.close_reason or self._conn.close_reason}")

    async def set_ttl(self, ttl_s: float) -> None:
        """Give the sandbox ``ttl_s`` more seconds to live, counted from now."""
        self._check_open()
        if ttl_s <= 0:
            raise SandboxError("a TTL must be a positive number of seconds")
        rid = self._conn.new_id()
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def on_frame(frame: Frame | None) -> None:
            if not done.done():
                done.set_result(None)

        self._conn.route(rid, on_frame)
        try:
            await self._conn.send(protocol.encode_u32(Op.TTL, rid, max(1, int(ttl_s * 1000))))
            await asyncio.wait_for(done, 10)
        finally:
            self._conn.unroute(rid)
        self._ttl_timer.cancel()
        self._ttl_timer = asyncio.get_running_loop().call_later(ttl_s, self._expire)
        self.expires_at = time.time() + ttl_s

    def stats(self) -> SandboxStats:
        g = self._group
        return SandboxStats(
            memory_bytes=_safe(g.memory_bytes),
            kernel_memory_bytes=_safe(g.kernel_memory_bytes),
            memory_peak_bytes=_safe(g.memory_peak_bytes),
            cpu_s=float(_safe(g.cpu_seconds)),
            pids=_safe(g.pids_current),
            oom_kills=_safe(g.oom_kills),
        )

    # -- commands

    def _env(self, env: Mapping[str, str] | None, cwd: str) -> dict[str, str]:
        merged = dict(self._base_env)
        if env:
            merged.update(validate_env(env, "exec env"))
        merged["PWD"] = cwd
        return merged

    def _abs(self, path: str) -> str:
        if not path or "\0" in path:
            raise SandboxFileError(f"invalid path {path!r}: give a non-empty path without NUL bytes")
        return path if path.startswith("/") else os.path.join(self.spec.workdir, path)

    async def spawn(
        self,
        command: str,
        *,
        timeout_s: float | None = 60,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bool = False,
        output_cap: int | None = None,
    ) -> BwrapProcess:
        """Start ``command`` (run by ``/bin/sh -c``) and return a handle to talk to it."""
        self._check_open()
        if "\0" in command:
            raise SandboxError("a command cannot contain NUL bytes")
        if timeout_s is not None and timeout_s <= 0:
            raise SandboxError(f"timeout_s must be positive, got {timeout_s}")
        workdir = self._abs(cwd) if cwd else self.spec.workdir
        cap = self.provider.output_cap if output_cap is None else output_cap
        proc = BwrapProcess(self, self._conn.new_id(), cap, timeout_s)
        self._conn.route(proc.rid, proc._on_frame)
        try:
            await self._conn.send(
                protocol.encode_exec(
                    proc.rid,
                    command=command,
                    cwd=workdir,
                    env=self._env(env, workdir),
                    timeout_s=timeout_s,
                    output_cap=cap,
                    stdin=stdin,
                )
            )
            await proc._started
        except ConnectionError as exc:
            self._conn.unroute(proc.rid)
            raise self._closed_error() from exc
        except BaseException:
            self._conn.unroute(proc.rid)
            raise
        return proc

    def _closed_error(self) -> SandboxClosedError:
        reason = self.close_reason or self._conn.close_reason or "its supervisor exited"
        return SandboxClosedError(f"sandbox {self.id} is closed: {reason}")

    async def exec(
        self,
        command: str,
        *,
        timeout_s: float = 60,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        output_cap: int | None = None,
    ) -> ExecResult:
        proc = await self.spawn(
            command, timeout_s=timeout_s, cwd=cwd, env=env, stdin=stdin is not None, output_cap=output_cap
        )
        try:
            if stdin is not None:
                await proc.write_stdin(stdin)
                await proc.close_stdin()
            return await proc.wait()
        except asyncio.CancelledError:
            proc._abandon()
            raise

    # -- files

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        async def chunks() -> AsyncIterator[bytes]:
            yield data

        await self.write_file_stream(path, chunks(), mode)

    async def write_file_stream(self, path: str, chunks: AsyncIterator[bytes], mode: int = 0o644) -> int:
        """Write a file from an async stream of byte chunks; parent directories are made. Returns its size."""
        self._check_open()
        target = self._abs(path)
        rid = self._conn.new_id()
        replies: asyncio.Queue[Frame | None] = asyncio.Queue()
        open_failed = False

        def on_frame(frame: Frame | None) -> None:
            nonlocal open_failed
            open_failed = open_failed or frame is None or frame.op is Op.FAIL
            replies.put_nowait(frame)

        self._conn.route(rid, on_frame)
        size = 0
        try:
            await self._conn.send(protocol.encode_wopen(rid, target, mode))
            async for chunk in chunks:
                for i in range(0, len(chunk), protocol.CHUNK):
                    piece = chunk[i : i + protocol.CHUNK]
                    await self._conn.send(protocol.encode(Op.WDATA, rid, piece))
                    size += len(piece)
                if open_failed:
                    break  # no point sending the rest
            await self._conn.send(protocol.encode(Op.WCLOSE, rid))
            for _ in range(2):
                frame = await replies.get()
                if frame is None:
                    raise self._closed_error()
                if frame.op is Op.FAIL:
                    errno_, msg = protocol.decode_fail(frame.payload)
                    raise SandboxFileError(f"cannot write {target} in sandbox {self.id}: {msg}", errno=errno_)
        except ConnectionError as exc:
            raise self._closed_error() from exc
        finally:
            self._conn.unroute(rid)
        return size

    async def read_file(self, path: str) -> bytes:
        return b"".join([chunk async for chunk in self.read_file_stream(path)])

    async def read_file_stream(self, path: str) -> AsyncIterator[bytes]:
        """The bytes of a file, window by window (memory stays bounded for any file size)."""
        self._check_open()
        target = self._abs(path)
        offset = 0
        while True:
            rid = self._conn.new_id()
            replies: asyncio.Queue[Frame | None] = asyncio.Queue()
            self._conn.route(rid, replies.put_nowait)
            got = 0
            try:
                await self._conn.send(protocol.encode_read(rid, target, offset, READ_WINDOW))
                while True:
                    frame = await replies.get()
                    if frame is None:
                        raise self._closed_error()
                    if frame.op is Op.DATA:
                        got += len(frame.payload)
                        yield frame.payload
                    elif frame.op is Op.END:
                        break
                    elif frame.op is Op.FAIL:
                        errno_, msg = protocol.decode_fail(frame.payload)
                        raise SandboxFileError(f"cannot read {target} in sandbox {self.id}: {msg}", errno=errno_)
            except ConnectionError as exc:
                raise self._closed_error() from exc
            finally:
                self._conn.unroute(rid)
            if got < READ_WINDOW:
                return
            offset += got


class BwrapProcess:
    """A command running in a :class:`BwrapSandbox` (see :class:`sandrl.sandbox.base.SandboxProcess`)."""

    def __init__(self, sandbox: BwrapSandbox, rid: int, cap: int, timeout_s: float | None) -> None:
        loop = asyncio.get_running_loop()
        self.sandbox = sandbox
        self.rid = rid
        self.pid = 0
        self._cap = cap
        self._timeout_s = timeout_s
        self._started: asyncio.Future[int] = loop.create_future()
        self._exit: asyncio.Future[protocol.ExitInfo] = loop.create_future()
        self._pending: deque[OutputChunk] = deque()
        self._taken = {"stdout": 0, "stderr": 0}
        self._truncated = False
        self._wake = asyncio.Event()

    def _on_frame(self, frame: Frame | None) -> None:
        if frame is None:
            err = self.sandbox._closed_error()
            for fut in (self._started, self._exit):
                if not fut.done():
                    fut.set_exception(err)
                    fut.exception()
            self._wake.set()
            return
        if frame.op is Op.STARTED:
            self.pid = int.from_bytes(frame.payload[:4], "little")
            if not self._started.done():
                self._started.set_result(self.pid)
        elif frame.op in (Op.STDOUT, Op.STDERR):
            stream: Literal["stdout", "stderr"] = "stdout" if frame.op is Op.STDOUT else "stderr"
            room = self._cap - self._taken[stream]
            data = frame.payload[: max(room, 0)]
            if len(data) < len(frame.payload):
                self._truncated = True  # the agent caps too; this guards the provider's memory
            if data:
                self._taken[stream] += len(data)
                self._pending.append(OutputChunk(stream, data))
                self._wake.set()
        elif frame.op is Op.EXIT:
            if not self._exit.done():
                self._exit.set_result(protocol.decode_exit(frame.payload))
            self.sandbox._conn.unroute(self.rid)
            self._wake.set()
        elif frame.op is Op.FAIL:
            _, msg = protocol.decode_fail(frame.payload)
            failure = SandboxError(f"sandbox {self.sandbox.id} could not run the command: {msg}")
            for fut in (self._started, self._exit):
                if not fut.done():
                    fut.set_exception(failure)
                    fut.exception()
            self.sandbox._conn.unroute(self.rid)
            self._wake.set()

    async def output(self) -> AsyncIterator[OutputChunk]:
        while True:
            while self._pending:
                yield self._pending.popleft()
            if self._exit.done():
                return
            self._wake.clear()
            await self._wake.wait()

    async def write_stdin(self, data: bytes) -> None:
        try:
            for i in range(0, len(data), protocol.CHUNK):
                await self.sandbox._conn.send(protocol.encode(Op.STDIN, self.rid, data[i : i + protocol.CHUNK]))
        except ConnectionError as exc:
            raise self.sandbox._closed_error() from exc

    async def close_stdin(self) -> None:
        with contextlib.suppress(ConnectionError):
            await self.sandbox._conn.send(protocol.encode(Op.STDIN, self.rid))

    async def signal(self, signum: int) -> None:
        with contextlib.suppress(ConnectionError):
            await self.sandbox._conn.send(protocol.encode_u32(Op.SIGNAL, self.rid, signum))

    async def kill(self) -> None:
        await self.signal(signal.SIGKILL)

    def _abandon(self) -> None:
        """The caller gave up (cancelled): kill the command rather than let it run on unseen."""
        if not self._exit.done() and not self.sandbox._conn.closed.is_set():
            with contextlib.suppress(Exception):
                self.sandbox._conn._writer.write(protocol.encode_u32(Op.SIGNAL, self.rid, signal.SIGKILL))
        self.sandbox._conn.unroute(self.rid)

    async def wait(self) -> ExecResult:
        limit = None if self._timeout_s is None else self._timeout_s + EXEC_GRACE_S
        try:
            info = await asyncio.wait_for(asyncio.shield(self._exit), limit)
        except TimeoutError:
            await self.sandbox.close()
            raise SandboxError(
                f"sandbox {self.sandbox.id} did not finish a command {EXEC_GRACE_S:g} s after its timeout; "
                "the sandbox was closed"
            ) from None
        out = bytearray()
        err = bytearray()
        while self._pending:
            chunk = self._pending.popleft()
            (out if chunk.stream == "stdout" else err).extend(chunk.data)
        return ExecResult(
            exit_code=info.exit_code,
            stdout=out.decode("utf-8", errors="replace"),
            stderr=err.decode("utf-8", errors="replace"),
            duration_s=info.duration_s,
            timed_out=info.timed_out,
            truncated=info.truncated or self._truncated,
        )


def _safe(fn: object) -> int:
    try:
        value = fn()  # type: ignore[operator]
    except (OSError, ValueError):
        return 0
    return value  # type: ignore[no-any-return]


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _mem_available_mb() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        return None
    return None


def _remove_group_dir(d: Path) -> None:
    """Kill what is in a leftover cgroup and remove it."""
    for _ in range(500):
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            try:
                (d / "cgroup.kill").write_text("1")
            except OSError:
                with contextlib.suppress(OSError):
                    for pid in (d / "cgroup.procs").read_text().split():
                        with contextlib.suppress(OSError):
                            os.kill(int(pid), signal.SIGKILL)
            time.sleep(0.002)


_LIVE_PROVIDERS: weakref.WeakSet[BwrapProvider] = weakref.WeakSet()


@atexit.register
def _cleanup_at_exit() -> None:
    for provider in list(_LIVE_PROVIDERS):
        provider._close_all_sync()
