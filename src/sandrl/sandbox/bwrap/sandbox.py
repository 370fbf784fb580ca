"""A live sandbox of the bubblewrap backend.

:class:`BwrapSandbox` speaks the agent protocol (:mod:`sandrl.sandbox.bwrap.protocol`) over the
sandbox's socket: execs, streamed processes (:mod:`.process`), files, TTL, and teardown, and says
why it ended when it ended on its own (:mod:`.crash`). It is made by
:class:`~sandrl.sandbox.bwrap.provider.BwrapProvider`; see that module for how and the threat model.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TypeVar, Unpack

from sandrl.errors import (
    SandboxClosedError,
    SandboxCrashedError,
    SandboxError,
    SandboxFileError,
    SandboxPausedError,
)
from sandrl.images.manifest import DEFAULT_PATH
from sandrl.processes import reap_in_background, wait_exited
from sandrl.sandbox.base import (
    MAX_READ_BYTES,
    ExecCall,
    ExecOptions,
    ExecResult,
    SandboxBase,
    SandboxSpec,
    check_max_bytes,
    file_too_large,
    validate_env,
)
from sandrl.sandbox.bwrap import protocol
from sandrl.sandbox.bwrap.cgroups import SandboxCgroup, SandboxStats
from sandrl.sandbox.bwrap.crash import CrashEvidence, crash_cause
from sandrl.sandbox.bwrap.images import MountPlan
from sandrl.sandbox.bwrap.port_forward import forward_into
from sandrl.sandbox.bwrap.process import BwrapProcess
from sandrl.sandbox.bwrap.protocol import AgentConnection, Frame, Op
from sandrl.sandbox.command import Command, check_command
from sandrl.sandbox.forwarding import PortForward

REPLY_TIMEOUT_S = 30.0
"""Longest wait for the agent to take a request or answer it (a command's start, a file's next
frame, a TTL change). The agent is one thread serving the whole sandbox: one that does not answer
for this long is stuck (e.g. blocked by something the sandbox made), and the sandbox is closed
rather than left to hang every caller."""
PAUSE_HOLD_S = 7 * 24 * 3600.0
"""How long pid 1's own TTL clock is pushed out while the sandbox is paused (a week)."""
READ_WINDOW = 4 << 20
UPPER_DIR = "/tmp/sandrl/upper"
"""Where the helper keeps the overlays' writable directories, in its mount namespace (see
``native/sandrl-helper.c``), on the one tmpfs of ``disk_mb``."""

HOST_WORK = concurrent.futures.ThreadPoolExecutor(
    max_workers=max(2, min(8, os.cpu_count() or 2)), thread_name_prefix="sandrl-host"
)
"""Runs the blocking host work of creates (slot, record, cgroups, fork+exec) off the event loop. As many
threads as cores: the work is mostly syscalls, and each thread more only adds hand-offs of the GIL that
delay the event loop (with asyncio's default pool of 6 on 2 cores, an exec's answer under 256 clients
waited behind them)."""
HOST_CLEANUP = concurrent.futures.ThreadPoolExecutor(
    max_workers=max(2, min(8, os.cpu_count() or 2)), thread_name_prefix="sandrl-cleanup"
)
"""Runs the removals of closes and of undone creates: a removal may wait for a cgroup to empty (up to
10 s for processes stuck in the kernel), and on a pool of its own that wait never holds up a create."""

T = TypeVar("T")


class BwrapSandbox(SandboxBase):
    """One live sandbox made by :class:`~sandrl.sandbox.bwrap.provider.BwrapProvider`.

    ``output_cap`` is the default cap of each output stream of a command. The provider's own
    bookkeeping (its record of the sandbox, its set of live ones) is a close callback like any
    other, so the sandbox knows nothing of the provider.
    """

    def __init__(
        self,
        sid: str,
        spec: SandboxSpec,
        image_env: dict[str, str],
        slot_index: int,
        group: SandboxCgroup,
        proc: subprocess.Popen[bytes],
        conn: AgentConnection,
        *,
        output_cap: int,
    ) -> None:
        self.id = sid
        self.spec = spec
        self.output_cap = output_cap
        self.slot_index = slot_index
        self.created_at = time.time()
        self.expires_at = self.created_at + spec.ttl_s
        self._paused_ttl_s: float | None = None
        """While paused: the TTL it had left when it was paused."""
        self._snapshotter: Callable[[BwrapSandbox, str | None], Awaitable[str]] | None = None
        self._forker: Callable[[BwrapSandbox, int], Awaitable[list[BwrapSandbox]]] | None = None
        """Set by the provider (which has the image store and makes sandboxes)."""
        self.on_pause: Callable[[BwrapSandbox, float | None], None] | None = None
        """Told the TTL left when the sandbox is about to be paused, None once it runs again (the
        provider records it, so that a paused sandbox its crash left behind is reaped)."""
        self._group = group
        self._proc = proc
        self._conn = conn
        self._base_env = {
            "PATH": image_env.get("PATH", DEFAULT_PATH),
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
        self.removals: list[Callable[[], None]] = []
        """Blocking removals of what the sandbox left on the host (the provider's record of it), run
        off the event loop with the cgroups' removal when it ends, before the close callbacks."""
        self.close_reason = ""
        self.crash: SandboxCrashedError | None = None
        """Why the sandbox ended on its own (died or stopped answering), once it did."""
        self.reply_timeout_s = REPLY_TIMEOUT_S
        loop = asyncio.get_running_loop()
        self.first_command_ended: asyncio.Future[None] = loop.create_future()
        """Done once its first command has ended (or the sandbox has): until then a new sandbox is
        still starting, and background work that can wait does (:mod:`.premade`'s refills)."""
        self._ttl_timer = loop.call_later(spec.ttl_s, self._expire)
        self._watch: asyncio.Task[None] | None = None
        """Diagnoses and closes a sandbox whose agent ended on its own; made only then (a task per live
        sandbox cost ~1 KiB of the provider's memory each, and 10,000 of them)."""
        conn.on_close(self._connection_lost)

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

    def _connection_lost(self) -> None:
        if self._closing is None and self._watch is None:
            self._watch = asyncio.get_running_loop().create_task(self._watch_death(), name=f"sandrl-watch-{self.id}")

    async def _watch_death(self) -> None:
        if self._closing is None:
            if time.time() < self.expires_at - 1:
                self.close_reason = self._conn.close_reason
                await self._diagnose(self._conn.close_reason, wait_exit_s=2.0)
            else:  # the agent ends itself at the TTL too, and on a busy host before our timer fires
                self.close_reason = self._ttl_reason()
            self._start_close()

    async def _diagnose(self, what: str, *, wait_exit_s: float) -> SandboxCrashedError:
        """Record why the sandbox ended on its own (see :func:`crash_cause`), before its cgroup is removed."""
        deadline = time.monotonic() + wait_exit_s
        while self._proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        used = self._group.stats()
        evidence = CrashEvidence(
            exit_status=self._proc.poll(),
            oom_kills=used.oom_kills,
            memory_peak_bytes=used.memory_peak_bytes,
            memory_limit_bytes=self.spec.memory_mb << 20,
        )
        caused, why = crash_cause(evidence)
        if caused:
            advice = (
                "the sandbox's own processes caused it (an episode failure of what ran inside, not of the host); "
                "if the work really needs more, give the sandbox more memory_mb"
            )
        else:
            advice = "nothing shows that the sandbox's processes caused it; the work may be retried in a new sandbox"
        self.crash = SandboxCrashedError(
            f"sandbox {self.id} crashed ({what}): {why}; {advice}", caused_by_sandbox=caused
        )
        self.close_reason = f"it crashed ({what})"
        return self.crash

    async def _death_error(self) -> SandboxClosedError:
        """The error for a request the agent's end cut off: the crash, once diagnosed, if it died on its own."""
        if not self._conn.closed.is_set():
            # A send that failed on a broken socket: the reader sees the end a moment later.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await self._conn.closed.wait()
        if self._conn.closed.is_set() and self._watch is not None and not self._watch.done():
            await asyncio.wait([self._watch])
        return self.crash or self._closed_error()

    async def _stuck(self, what: str) -> SandboxClosedError:
        """The agent did not answer in time (``what`` says how): diagnose, close the sandbox, return the error."""
        if self.crash is None and self._closing is None:
            await self._diagnose(what, wait_exit_s=0)
        await self.close()
        return self.crash or self._closed_error()

    async def _answer(self, waiter: Awaitable[T], what: str) -> T:
        """``waiter``, bounded by ``reply_timeout_s``; a lost connection raises the death error."""
        try:
            async with asyncio.timeout(self.reply_timeout_s):
                return await waiter
        except TimeoutError:
            raise await self._stuck(f"its agent did not answer {what} within {self.reply_timeout_s:g} s") from None
        except ConnectionError as exc:
            raise await self._death_error() from exc

    async def _send(self, data: bytes, what: str) -> None:
        """Send one frame, bounded like :meth:`_answer`: an agent that stops reading fills the socket."""
        await self._answer(self._conn.send(data), what)

    def _ttl_reason(self) -> str:
        return f"its TTL of {self.spec.ttl_s:g} s expired"

    def _expire(self) -> None:
        if self._closing is None:
            self.close_reason = self._ttl_reason()
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

    def _command_ended(self) -> None:
        if not self.first_command_ended.done():
            self.first_command_ended.set_result(None)

    async def _cleanup(self) -> None:
        self._command_ended()
        self._ttl_timer.cancel()
        if self._paused_ttl_s is not None:
            self._paused_ttl_s = None
            with contextlib.suppress(Exception):  # a frozen pid 1 could not hear the close
                await asyncio.to_thread(self._group.freeze, False)
        # Closing the socket makes the agent (pid 1) exit, which kills and reaps everything in its
        # pid namespace; its monitor (bubblewrap, or the helper for a launch made ahead) exits only
        # after that, so once it has exited no process of the sandbox is left. SIGKILL through the
        # cgroup is the fallback.
        await self._conn.close()
        await wait_exited(self._proc, 2.0)
        await asyncio.get_running_loop().run_in_executor(HOST_CLEANUP, self._remove_traces)
        self._run_close_callbacks()
        if self._watch is not None and self._watch is not asyncio.current_task():
            self._watch.cancel()

    def _remove_traces(self) -> None:
        """Kill what is left, reap, remove the cgroups and run :attr:`removals`: blocking (~2 ms of
        rmdirs and unlinks), so :meth:`close` runs it in a thread."""
        if self._proc.poll() is None:
            self._group.kill()
            with contextlib.suppress(Exception):
                self._proc.kill()
        with contextlib.suppress(Exception):
            self._proc.wait(timeout=1)
        self._group.remove()
        reap_in_background(self._proc)
        removals, self.removals = self.removals, []
        for removal in removals:
            removal()

    def _run_close_callbacks(self) -> None:
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
        self._remove_traces()
        self._run_close_callbacks()

    def _check_open(self) -> None:
        if self._closing is not None or self._conn.closed.is_set():
            raise self.crash or SandboxClosedError(
                f"sandbox {self.id} is closed: {self.close_reason or self._conn.close_reason}"
            )
        if self._paused_ttl_s is not None:
            raise SandboxPausedError(f"sandbox {self.id} is paused: resume it first")

    @property
    def paused(self) -> bool:
        return self._paused_ttl_s is not None

    async def snapshot(self, name: str | None = None) -> str:
        """An image of this sandbox's files as they are now (:mod:`.snapshot`); its name."""
        self._check_open_or_paused()
        assert self._snapshotter is not None
        return await self._snapshotter(self, name)

    async def fork(self, n: int) -> list[BwrapSandbox]:
        """``n`` new sandboxes from this one's current files (:mod:`.snapshot`); this one runs on."""
        self._check_open_or_paused()
        assert self._forker is not None
        return await self._forker(self, n)

    async def forward_port(self, port: int, target: tuple[str, int]) -> PortForward:
        """Its own ``127.0.0.1:port`` relayed to the host's ``target`` until it closes (:mod:`.port_forward`)."""
        self._check_open()
        return await forward_into(self, port, target)

    def _check_open_or_paused(self) -> None:
        if self._snapshotter is None or self._forker is None:
            raise SandboxError(f"sandbox {self.id} was not made by a provider that keeps images")
        if self._paused_ttl_s is None:
            self._check_open()
        elif self._closing is not None or self._conn.closed.is_set():
            raise SandboxClosedError(f"sandbox {self.id} is closed: {self.close_reason}")

    async def pause(self) -> None:
        """Freeze every process of the sandbox (no CPU until :meth:`resume`) and stop its TTL clock."""
        self._check_open()
        remaining = max(self.expires_at - time.time(), 1.0)
        if self.on_pause is not None:  # first: a provider that dies from here on leaves a record to reap
            self.on_pause(self, remaining)
        try:
            # Pid 1 keeps its own TTL clock, which freezing does not stop: give it room for the pause
            # (the provider's timer is off meanwhile).
            await self.set_ttl(remaining + PAUSE_HOLD_S)
            self._ttl_timer.cancel()
            await asyncio.to_thread(self._group.freeze, True)
        except BaseException:
            if self.on_pause is not None and not self.closed:
                self.on_pause(self, None)
            raise
        self._paused_ttl_s = remaining

    async def resume(self) -> None:
        """Thaw the sandbox; its TTL goes on from where :meth:`pause` stopped it."""
        if self._paused_ttl_s is None:
            self._check_open()
            return
        remaining, self._paused_ttl_s = self._paused_ttl_s, None
        await asyncio.to_thread(self._group.freeze, False)
        await self.set_ttl(remaining)
        if self.on_pause is not None:
            self.on_pause(self, None)

    async def set_ttl(self, ttl_s: float) -> None:
        """Give the sandbox ``ttl_s`` more seconds to live, counted from now."""
        rid, done = await self._send_ttl(ttl_s)
        try:
            if await self._answer(done, "a TTL change") is None:
                raise await self._death_error()
        finally:
            self._conn.unroute(rid)
        self._restart_ttl_timer(ttl_s)

    async def set_ttl_ahead(self, ttl_s: float) -> None:
        """:meth:`set_ttl` with no round trip (the agent says yes, in order); a dead sandbox fails its next request."""
        rid, done = await self._send_ttl(ttl_s)
        done.add_done_callback(lambda _: self._conn.unroute(rid))
        self._restart_ttl_timer(ttl_s)

    async def _send_ttl(self, ttl_s: float) -> tuple[int, asyncio.Future[Frame | None]]:
        """Send the agent its new TTL; the request's id, and the future its answer resolves."""
        self._check_open()
        if ttl_s <= 0:
            raise SandboxError("a TTL must be a positive number of seconds")
        rid = self._conn.new_id()
        done: asyncio.Future[Frame | None] = asyncio.get_running_loop().create_future()

        def on_frame(frame: Frame | None) -> None:
            if not done.done():
                done.set_result(frame)

        self._conn.route(rid, on_frame)
        try:
            await self._send(protocol.encode_u32(Op.TTL, rid, max(1, int(ttl_s * 1000))), "a TTL change")
        except BaseException:
            self._conn.unroute(rid)
            raise
        return rid, done

    def _restart_ttl_timer(self, ttl_s: float) -> None:
        self._ttl_timer.cancel()
        self._ttl_timer = asyncio.get_running_loop().call_later(ttl_s, self._expire)
        self.expires_at = time.time() + ttl_s

    def stats(self) -> SandboxStats:
        return self._group.stats()

    def disk_usage(self) -> tuple[int, int]:
        """Bytes used and the size of the writable layer (its tmpfs, ``disk_mb``); (0, 0) once closed."""
        try:
            st = os.statvfs(f"/proc/{self._proc.pid}/root{UPPER_DIR}")
        except OSError:
            return 0, 0
        return (st.f_blocks - st.f_bfree) * st.f_frsize, st.f_blocks * st.f_frsize

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
        command: Command,
        *,
        timeout_s: float | None = 60,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bool = False,
        output_cap: int | None = None,
    ) -> BwrapProcess:
        """Start ``command`` (a string run by ``/bin/sh -c``, an argv run directly: :mod:`sandrl.sandbox.command`)
        and return a handle to talk to it."""
        self._check_open()
        command = check_command(command)
        if timeout_s is not None and timeout_s <= 0:
            raise SandboxError(f"timeout_s must be positive, got {timeout_s}")
        workdir = self._abs(cwd) if cwd else self.spec.workdir
        cap = self.output_cap if output_cap is None else output_cap
        rid = self._conn.new_id()
        request = protocol.encode_exec(
            rid,
            command=command,
            cwd=workdir,
            env=self._env(env, workdir),
            timeout_s=timeout_s,
            output_cap=cap,
            stdin=stdin,
        )
        proc = BwrapProcess(self, rid, cap, timeout_s)
        self._conn.route(proc.rid, proc._on_frame)
        try:
            await self._send(request, "a command's start")
            await self._answer(asyncio.shield(proc._started), "a command's start")
        except BaseException:
            self._conn.unroute(proc.rid)
            raise
        return proc

    def _closed_error(self) -> SandboxClosedError:
        reason = self.close_reason or self._conn.close_reason or "its supervisor exited"
        return SandboxClosedError(f"sandbox {self.id} is closed: {reason}")

    async def exec(
        self, command: Command, *, output_cap: int | None = None, **options: Unpack[ExecOptions]
    ) -> ExecResult:
        """:meth:`~sandrl.sandbox.base.Sandbox.exec`; ``output_cap`` bounds each output stream (the provider's)."""
        return await self._exec(ExecCall(command, **options), output_cap)

    async def _exec(self, call: ExecCall, output_cap: int | None = None) -> ExecResult:
        stdin = call.stdin
        proc = await self.spawn(
            call.command,
            timeout_s=call.timeout_s,
            cwd=call.cwd,
            env=call.env,
            stdin=stdin is not None,
            output_cap=output_cap,
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
        closed = False
        what = f"a write of {target}"
        try:
            await self._send(protocol.encode_wopen(rid, target, mode), what)
            async for chunk in chunks:
                for i in range(0, len(chunk), protocol.CHUNK):
                    piece = chunk[i : i + protocol.CHUNK]
                    await self._send(protocol.encode(Op.WDATA, rid, piece), what)
                    size += len(piece)
                if open_failed:
                    break  # no point sending the rest
            closed = True
            await self._send(protocol.encode(Op.WCLOSE, rid), what)
            for _ in range(2):
                frame = await self._answer(replies.get(), what)
                if frame is None:
                    raise await self._death_error()
                if frame.op is Op.FAIL:
                    errno_, msg = protocol.decode_fail(frame.payload)
                    raise SandboxFileError(f"cannot write {target} in sandbox {self.id}: {msg}", errno=errno_)
        finally:
            if not closed:
                # The caller's stream failed (a client gone mid-upload): free the agent's slot for
                # this file, or a few hundred such uploads would use them all up.
                self._conn.send_nowait(protocol.encode(Op.WCLOSE, rid))
            self._conn.unroute(rid)
        return size

    async def read_file(self, path: str, *, max_bytes: int = MAX_READ_BYTES) -> bytes:
        return b"".join([chunk async for chunk in self.read_file_stream(path, max_bytes=max_bytes)])

    async def read_file_stream(self, path: str, *, max_bytes: int = MAX_READ_BYTES) -> AsyncIterator[bytes]:
        """The bytes of a file, window by window (memory stays bounded for any file size).

        At most ``max_bytes`` are yielded; a file with more raises
        :class:`~sandrl.errors.SandboxFileTooLargeError` once the byte after them has been seen.
        """
        check_max_bytes(max_bytes)
        self._check_open()
        target = self._abs(path)
        what = f"a read of {target}"
        offset = 0
        while True:
            # One byte past the bound tells a file of exactly max_bytes from a larger one.
            want = min(READ_WINDOW, max_bytes + 1 - offset)
            rid = self._conn.new_id()
            replies: asyncio.Queue[Frame | None] = asyncio.Queue()
            self._conn.route(rid, replies.put_nowait)
            got = 0
            try:
                await self._send(protocol.encode_read(rid, target, offset, want), what)
                while True:
                    frame = await self._answer(replies.get(), what)
                    if frame is None:
                        raise await self._death_error()
                    if frame.op is Op.DATA:
                        if offset + got + len(frame.payload) > max_bytes:
                            raise file_too_large(target, self.id, max_bytes)
                        got += len(frame.payload)
                        yield frame.payload
                    elif frame.op is Op.END:
                        break
                    elif frame.op is Op.FAIL:
                        errno_, msg = protocol.decode_fail(frame.payload)
                        raise SandboxFileError(f"cannot read {target} in sandbox {self.id}: {msg}", errno=errno_)
            finally:
                self._conn.unroute(rid)
            if got < want:
                return
            offset += got
