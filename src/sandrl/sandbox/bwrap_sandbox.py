"""A live sandbox of the bubblewrap backend, and the commands running in it.

:class:`BwrapSandbox` speaks the agent protocol (:mod:`sandrl.sandbox.protocol`) over the
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
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Literal

from sandrl.errors import SandboxClosedError, SandboxError, SandboxFileError
from sandrl.sandbox import protocol
from sandrl.sandbox.base import ExecResult, OutputChunk, SandboxSpec, validate_env
from sandrl.sandbox.cgroups import SandboxCgroup
from sandrl.sandbox.images import MountPlan
from sandrl.sandbox.protocol import AgentConnection, Frame, Op

if TYPE_CHECKING:
    from sandrl.sandbox.bwrap import BwrapProvider

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
