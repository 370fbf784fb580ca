"""A command running in a sandbox of the bubblewrap backend: its output, stdin, signals and exit.

:class:`BwrapProcess` is the handle :meth:`~.sandbox.BwrapSandbox.spawn` returns. It reads the
agent's frames for one request id and talks back through its sandbox's connection, bounded as
every wait on pid 1 is (:class:`ProcessHost`).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections import deque
from collections.abc import AsyncIterator
from typing import Literal, Protocol

from sandrl.errors import SandboxClosedError, SandboxError
from sandrl.sandbox.base import ExecResult, OutputChunk
from sandrl.sandbox.bwrap import protocol
from sandrl.sandbox.bwrap.protocol import AgentConnection, Frame, Op

EXEC_GRACE_S = 10.0
"""How long past a command's timeout the provider waits for the agent before giving up on it."""
STREAM_HIGH_WATER = 4 << 20
"""Output bytes a streaming reader (:meth:`BwrapProcess.output`) may leave untaken before the command
is paused; what is in flight then (the agent's buffer, the socket's) adds at most a few MiB more."""


class ProcessHost(Protocol):
    """What a command needs of the sandbox it runs in (a :class:`~.sandbox.BwrapSandbox`): its
    connection to pid 1, a send bounded by the reply timeout, and the error to raise when pid 1 is
    stuck or gone. A protocol, so that this module need not import the sandbox's."""

    id: str
    _conn: AgentConnection

    async def _send(self, data: bytes, what: str) -> None: ...

    async def _stuck(self, what: str) -> SandboxClosedError: ...

    async def _death_error(self) -> SandboxClosedError: ...

    def _command_ended(self) -> None: ...


class BwrapProcess:
    """A command running in a :class:`~.sandbox.BwrapSandbox` (see :class:`sandrl.sandbox.base.SandboxProcess`)."""

    def __init__(self, sandbox: ProcessHost, rid: int, cap: int, timeout_s: float | None) -> None:
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
            self.sandbox._command_ended()
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
            self.sandbox._command_ended()
            self._wake.set()
        elif frame.op is Op.FAIL:
            _, msg = protocol.decode_fail(frame.payload)
            failure = SandboxError(f"sandbox {self.sandbox.id} could not run the command: {msg}")
            for fut in (self._started, self._exit):
                if not fut.done():
                    fut.set_exception(failure)
                    fut.exception()
            self.sandbox._conn.unroute(self.rid)
            self.sandbox._command_ended()
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
