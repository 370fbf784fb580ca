"""A live sandbox of the bubblewrap backend, and the commands running in it.

:class:`BwrapSandbox` speaks the agent protocol (:mod:`sandrl.sandbox.bwrap.protocol`) over the
sandbox's socket: execs, streamed processes, files, TTL, and teardown. It is made by
:class:`sandrl.sandbox.bwrap.BwrapProvider`; see that module for how and the threat model.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Literal, TypeVar

from sandrl.errors import SandboxClosedError, SandboxCrashedError, SandboxError, SandboxFileError
from sandrl.sandbox.base import (
    MAX_READ_BYTES,
    ExecResult,
    OutputChunk,
    SandboxSpec,
    check_max_bytes,
    file_too_large,
    validate_env,
)
from sandrl.sandbox.bwrap import protocol
from sandrl.sandbox.bwrap.cgroups import SandboxCgroup
from sandrl.sandbox.bwrap.images import MountPlan
from sandrl.sandbox.bwrap.protocol import AgentConnection, Frame, Op

if TYPE_CHECKING:
    from sandrl.sandbox.bwrap import BwrapProvider

EXEC_GRACE_S = 10.0
"""How long past a command's timeout the provider waits for the agent before giving up on it."""
REPLY_TIMEOUT_S = 30.0
"""Longest wait for the agent to take a request or answer it (a command's start, a file's next
frame, a TTL change). The agent is one thread serving the whole sandbox: one that does not answer
for this long is stuck (e.g. blocked by something the sandbox made), and the sandbox is closed
rather than left to hang every caller."""
READ_WINDOW = 4 << 20
STREAM_HIGH_WATER = 4 << 20
"""Output bytes a streaming reader (:meth:`BwrapProcess.output`) may leave untaken before the command
is paused; what is in flight then (the agent's buffer, the socket's) adds at most a few MiB more."""
OOM_EXIT = 71
"""The agent's exit status when it cannot allocate memory."""
KILLED_EXITS = (128 + signal.SIGKILL, -signal.SIGKILL)
"""bubblewrap's status when the agent was SIGKILLed (128 + signal), or bubblewrap's own when it was."""

T = TypeVar("T")


@dataclass(frozen=True)
class CrashEvidence:
    """What a sandbox that ended on its own left behind, read before its cgroup goes."""

    exit_status: int | None
    """bubblewrap's exit status: the agent's own, 128 + N when a signal N killed the agent, -N when one
    killed bubblewrap itself; None while it still runs (the agent stopped answering)."""
    oom_kills: int
    """Processes the sandbox's memory cgroup OOM-killed during its life."""
    memory_peak_bytes: int
    memory_limit_bytes: int


def crash_cause(evidence: CrashEvidence) -> tuple[bool, str]:
    """Whether the sandbox's own processes brought it down, and the evidence in words.

    Only memory counts as theirs: the agent could not allocate (its exit status 71: the cgroup was
    full, or a limit was put on pid 1 from inside), or it was SIGKILLed while the memory cgroup's OOM
    killer was at work. The pids limit cannot end the agent (a fork that fails is an error reply),
    and anything else (the agent's socket closed, a kill from the host, a hung agent) is not
    something the sandbox's processes can be shown to have done.
    """
    status = evidence.exit_status
    memory = (
        f"its memory cgroup OOM-killed {evidence.oom_kills} process(es) and peaked at "
        f"{evidence.memory_peak_bytes >> 20} MiB of its {evidence.memory_limit_bytes >> 20} MiB limit"
    )
    if status == OOM_EXIT:
        return True, f"its agent (pid 1) could not allocate memory (exit status {OOM_EXIT}); {memory}"
    if status in KILLED_EXITS and evidence.oom_kills > 0:
        return True, f"its agent (pid 1) was killed by SIGKILL (status {status}) while {memory}"
    if status is None:
        return False, f"its agent (pid 1) stopped answering; {memory}"
    return False, f"its agent (pid 1) ended with status {status}; {memory}"


@dataclass(frozen=True)
class SandboxStats:
    memory_bytes: int
    kernel_memory_bytes: int
    memory_peak_bytes: int
    cpu_s: float
    pids: int
    oom_kills: int


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
        self.crash: SandboxCrashedError | None = None
        """Why the sandbox ended on its own (died or stopped answering), once it did."""
        self.reply_timeout_s = REPLY_TIMEOUT_S
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
            if time.time() < self.expires_at - 1:  # the agent ends itself at the TTL too: not a crash
                await self._diagnose(self._conn.close_reason, wait_exit_s=2.0)
            self._start_close()

    async def _diagnose(self, what: str, *, wait_exit_s: float) -> SandboxCrashedError:
        """Record why the sandbox ended on its own (see :func:`crash_cause`), before its cgroup is removed."""
        deadline = time.monotonic() + wait_exit_s
        while self._proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        evidence = CrashEvidence(
            exit_status=self._proc.poll(),
            oom_kills=_safe(self._group.oom_kills),
            memory_peak_bytes=_safe(self._group.memory_peak_bytes),
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
        if self._conn.closed.is_set() and not self._watch.done():
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
            raise self.crash or SandboxClosedError(
                f"sandbox {self.id} is closed: {self.close_reason or self._conn.close_reason}"
            )

    async def set_ttl(self, ttl_s: float) -> None:
        """Give the sandbox ``ttl_s`` more seconds to live, counted from now."""
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
            if await self._answer(done, "a TTL change") is None:
                raise await self._death_error()
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
        self._held = 0
        self._streaming = False
        self._paused = False
        self._taken = {"stdout": 0, "stderr": 0}
        self._truncated = False
        self._wake = asyncio.Event()

    def _pause(self, paused: bool) -> None:
        """Ask pid 1 to stop (or go back to) reading this command's pipes: the command then blocks on
        its full pipe, so a reader that does not keep up stalls the command, not the provider's memory."""
        if paused != self._paused and not self._exit.done():
            self._paused = paused
            self.sandbox._conn.send_nowait(protocol.encode_u32(Op.PAUSE, self.rid, int(paused)))

    def _on_frame(self, frame: Frame | None) -> None:
        if frame is None:
            # A ConnectionError, which the waiters turn into the sandbox's diagnosed death error.
            lost = ConnectionError(self.sandbox._conn.close_reason or "the sandbox's supervisor exited")
            for fut in (self._started, self._exit):
                if not fut.done():
                    fut.set_exception(lost)
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
                self._held += len(data)
                self._pending.append(OutputChunk(stream, data))
                self._wake.set()
                if self._streaming and self._held > STREAM_HIGH_WATER:
                    self._pause(True)
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
        """Output as it arrives, with back-pressure: past :data:`STREAM_HIGH_WATER` bytes not yet taken
        from here, the command's pipes are left unread until the reader has taken half of them."""
        self._streaming = True
        while True:
            while self._pending:
                chunk = self._pending.popleft()
                self._held -= len(chunk.data)
                if self._paused and self._held < STREAM_HIGH_WATER // 2:
                    self._pause(False)
                yield chunk
            if self._exit.done():
                return
            self._wake.clear()
            await self._wake.wait()

    async def write_stdin(self, data: bytes) -> None:
        for i in range(0, len(data), protocol.CHUNK):
            await self.sandbox._send(protocol.encode(Op.STDIN, self.rid, data[i : i + protocol.CHUNK]), "stdin")

    async def close_stdin(self) -> None:
        with contextlib.suppress(SandboxClosedError):
            await self.sandbox._send(protocol.encode(Op.STDIN, self.rid), "stdin")

    async def signal(self, signum: int) -> None:
        with contextlib.suppress(SandboxClosedError):
            await self.sandbox._send(protocol.encode_u32(Op.SIGNAL, self.rid, signum), "a signal")

    async def kill(self) -> None:
        await self.signal(signal.SIGKILL)

    def _abandon(self) -> None:
        """The caller gave up (cancelled): kill the command rather than let it run on unseen."""
        if not self._exit.done():
            self.sandbox._conn.send_nowait(protocol.encode_u32(Op.SIGNAL, self.rid, signal.SIGKILL))
        self.sandbox._conn.unroute(self.rid)

    async def wait(self) -> ExecResult:
        limit = None if self._timeout_s is None else self._timeout_s + EXEC_GRACE_S
        try:
            # asyncio.timeout, not wait_for: 3.11's wait_for drops a cancellation that meets the exit.
            async with asyncio.timeout(limit):
                info = await asyncio.shield(self._exit)
        except TimeoutError:
            raise await self.sandbox._stuck(
                f"its agent did not report a command's exit {EXEC_GRACE_S:g} s after its {self._timeout_s:g} s timeout"
            ) from None
        except ConnectionError as exc:
            raise await self.sandbox._death_error() from exc
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
