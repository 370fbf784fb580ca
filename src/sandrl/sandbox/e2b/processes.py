"""envd's ``process.Process`` service over sandrl sandboxes: start, stream, stdin, signals, list.

A started command is tracked by its pid inside the sandbox until it exits. Its output is read
by one pump task and fanned out to every stream watching it (the ``Start`` stream, and any
``Connect`` streams), so a client can disconnect and reconnect by pid. The command runs as
``cmd args...`` (the SDK sends ``/bin/bash -l -c <command>``) with the sandbox's workdir as the
default cwd, as root.

Timeouts follow E2B's envd: the SDK's ``timeout`` is the deadline of the ``Start`` stream
(``Connect-Timeout-Ms``); when it passes, the command is killed (its whole process group) and
the stream ends with ``deadline_exceeded``, which the SDK raises as ``TimeoutException``; the
SDK's ``timeout=0`` means no deadline. A client that only disconnects leaves the command
running, as ``CommandHandle.disconnect`` promises. The deadline of a ``Connect`` stream only
ends that stream. Output beyond the backend's output cap (1 MiB a stream) is dropped.
PTYs are not supported yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import signal
import time
from collections.abc import AsyncIterator
from typing import Any, Literal, TypeAlias

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from protobuf import Oneof

from sandrl.errors import ConfigError, SandboxClosedError, SandrlError
from sandrl.sandbox.base import ExecResult, SandboxProcess
from sandrl.sandbox.e2b.proto import process_pb as pb
from sandrl.sandbox.e2b.proto.process_connect import Process
from sandrl.sandbox.e2b.state import E2BRegistry, E2BSandbox, Refused, resolve
from sandrl.sandbox.service import Entry

Item: TypeAlias = pb.ProcessEvent | None
DEADLINE_GRACE_S = 5.0
"""The backend kills a command this long after its stream's deadline, should the stream's own kill not land."""
DEFAULT_KEEPALIVE_S = 50.0
_SIGNALS = {pb.Signal.SIGKILL: signal.SIGKILL, pb.Signal.SIGTERM: signal.SIGTERM}


def connect_error(exc: SandrlError | Refused) -> ConnectError:
    """A sandrl error (or a refused envd call) as the Connect error the SDK maps to its own exceptions."""
    if isinstance(exc, Refused):
        code = {"unauthenticated": Code.UNAUTHENTICATED, "port": Code.UNAVAILABLE}.get(exc.kind, Code.UNAVAILABLE)
        return ConnectError(code, exc.message)
    if isinstance(exc, SandboxClosedError):
        return ConnectError(Code.UNAVAILABLE, f"{exc.message} (the sandbox was not found)")
    if isinstance(exc, ConfigError):
        return ConnectError(Code.INVALID_ARGUMENT, exc.message)
    codes = {400: Code.INVALID_ARGUMENT, 404: Code.NOT_FOUND, 410: Code.UNAVAILABLE, 429: Code.RESOURCE_EXHAUSTED}
    return ConnectError(codes.get(exc.http_status, Code.INTERNAL), exc.message)


def end_event(result: ExecResult) -> pb.ProcessEvent.EndEvent:
    """envd's end event for a result: a signal death is exit code -1 and 'signal: <name>', as Go reports it."""
    if result.exit_code < 0:
        try:
            name = signal.Signals(-result.exit_code).name.removeprefix("SIG").lower()
        except ValueError:
            name = str(-result.exit_code)
        name = {"kill": "killed", "term": "terminated", "int": "interrupt"}.get(name, name)
        status = f"signal: {name}"
        return pb.ProcessEvent.EndEvent(exit_code=-1, exited=False, status=status, error=status)
    status = f"exit status {result.exit_code}"
    if result.timed_out:
        return pb.ProcessEvent.EndEvent(
            exit_code=result.exit_code, exited=True, status=status, error="the command ran past its timeout"
        )
    if result.exit_code == 0:
        return pb.ProcessEvent.EndEvent(exit_code=0, exited=True, status=status)
    return pb.ProcessEvent.EndEvent(exit_code=result.exit_code, exited=True, status=status, error=status)


WATCH_QUEUE_ITEMS = 64
"""Output events (each at most 64 KiB) a watching stream may be behind before the command waits for it."""


class Tracked:
    """One command the table tracks, with the streams watching it."""

    def __init__(
        self, table: ProcessTable, proc: SandboxProcess, config: pb.ProcessConfig, tag: str | None, stdin: bool
    ) -> None:
        self.table = table
        self.proc = proc
        self.pid = proc.pid
        self.config = config
        self.tag = tag
        self.stdin = stdin
        self.started = time.monotonic()
        self.ended: pb.ProcessEvent | None = None
        self._watchers: set[asyncio.Queue[Item]] = set()
        self._pump = asyncio.get_running_loop().create_task(self._run(), name=f"sandrl-e2b-proc-{self.pid}")

    def watch(self) -> asyncio.Queue[Item]:
        queue: asyncio.Queue[Item] = asyncio.Queue(maxsize=WATCH_QUEUE_ITEMS)
        self._watchers.add(queue)
        return queue

    def unwatch(self, queue: asyncio.Queue[Item]) -> None:
        self._watchers.discard(queue)
        while not queue.empty():  # frees the pump if it waits for room in this queue
            queue.get_nowait()

    async def _publish(self, item: Item) -> None:
        # Waits for room: a watcher that does not read holds the command back (the provider stops
        # reading its pipes) instead of growing this server's memory.
        for queue in list(self._watchers):
            await queue.put(item)

    async def _run(self) -> None:
        try:
            async for chunk in self.proc.output():
                await self._publish(_data_event(chunk.stream, chunk.data))
            end = end_event(await self.proc.wait())
        except SandrlError as exc:
            end = pb.ProcessEvent.EndEvent(exit_code=-1, exited=False, status="error", error=exc.message)
        self.ended = _end_event(end)
        self.table.done(self)
        await self._publish(self.ended)
        await self._publish(None)

    def cancel(self) -> None:
        self._pump.cancel()


class ProcessTable:
    """The tracked commands of one sandbox, by pid."""

    def __init__(self) -> None:
        self.by_pid: dict[int, Tracked] = {}

    def add(self, tracked: Tracked) -> None:
        self.by_pid[tracked.pid] = tracked

    def done(self, tracked: Tracked) -> None:
        if self.by_pid.get(tracked.pid) is tracked:
            del self.by_pid[tracked.pid]

    def select(self, selector: pb.ProcessSelector | None) -> Tracked:
        choice = selector.selector if selector is not None else None
        if choice is not None and choice.field == "pid":
            tracked = self.by_pid.get(int(choice.value))
            if tracked is not None:
                return tracked
            raise ConnectError(Code.NOT_FOUND, f"process with pid {choice.value} not found")
        if choice is not None and choice.field == "tag":
            for tracked in self.by_pid.values():
                if tracked.tag == choice.value:
                    return tracked
            raise ConnectError(Code.NOT_FOUND, f"process with tag {choice.value!r} not found")
        raise ConnectError(Code.INVALID_ARGUMENT, "select the process by pid or tag")

    def forget(self) -> None:
        for tracked in list(self.by_pid.values()):
            tracked.cancel()
        self.by_pid.clear()


def _keepalive_s(ctx: RequestContext[Any, Any]) -> float:
    try:
        value = float(ctx.request_headers.get("keepalive-ping-interval", DEFAULT_KEEPALIVE_S))
    except ValueError:
        value = DEFAULT_KEEPALIVE_S
    return min(max(value, 1.0), 300.0)


def _start_event(pid: int) -> pb.ProcessEvent:
    start = Oneof[Literal["start"], pb.ProcessEvent.StartEvent]("start", pb.ProcessEvent.StartEvent(pid=pid))
    return pb.ProcessEvent(event=start)


def _data_event(stream: str, data: bytes) -> pb.ProcessEvent:
    output = (
        Oneof[Literal["stdout"], bytes]("stdout", data)
        if stream == "stdout"
        else Oneof[Literal["stderr"], bytes]("stderr", data)
    )
    event = pb.ProcessEvent.DataEvent(output=output)
    return pb.ProcessEvent(event=Oneof[Literal["data"], pb.ProcessEvent.DataEvent]("data", event))


def _end_event(end: pb.ProcessEvent.EndEvent) -> pb.ProcessEvent:
    return pb.ProcessEvent(event=Oneof[Literal["end"], pb.ProcessEvent.EndEvent]("end", end))


def _keepalive() -> pb.ProcessEvent:
    keep = Oneof[Literal["keepalive"], pb.ProcessEvent.KeepAlive]("keepalive", pb.ProcessEvent.KeepAlive())
    return pb.ProcessEvent(event=keep)


class ProcessService(Process):
    """The ``process.Process`` Connect service (see :mod:`sandrl.sandbox.e2b.proto.process_connect`)."""

    def __init__(self, registry: E2BRegistry) -> None:
        self.registry = registry

    def _sandbox(self, ctx: RequestContext[Any, Any]) -> tuple[Entry, E2BSandbox, ProcessTable]:
        try:
            entry, record = resolve(self.registry, ctx.request_headers)
        except Refused as exc:
            raise connect_error(exc) from None
        if record.processes is None:
            record.processes = ProcessTable()
        return entry, record, record.processes

    async def list(
        self, request: pb.ListRequest, ctx: RequestContext[pb.ListRequest, pb.ListResponse]
    ) -> pb.ListResponse:
        _, _, table = self._sandbox(ctx)
        return pb.ListResponse(
            processes=[pb.ProcessInfo(config=t.config, pid=t.pid, tag=t.tag) for t in table.by_pid.values()]
        )

    async def start(
        self, request: pb.StartRequest, ctx: RequestContext[pb.StartRequest, pb.StartResponse]
    ) -> AsyncIterator[pb.StartResponse]:
        entry, _, table = self._sandbox(ctx)
        if request.pty is not None:
            raise ConnectError(Code.UNIMPLEMENTED, "PTYs are not supported yet by sandrl: run the command without one")
        config = request.process
        if config is None or not config.cmd:
            raise ConnectError(Code.INVALID_ARGUMENT, "the start request names no command (process.cmd)")
        svc = self.registry.service
        sandbox = svc.streaming(entry)
        if sandbox is None:
            raise ConnectError(Code.UNIMPLEMENTED, "this server's sandbox backend cannot stream processes")
        deadline_ms = ctx.timeout_ms
        stdin = bool(request.stdin)
        try:
            proc = await sandbox.spawn(
                "exec " + shlex.join([config.cmd, *config.args]),
                timeout_s=None if deadline_ms is None else deadline_ms / 1000 + DEADLINE_GRACE_S,
                cwd=config.cwd if config.has_field("cwd") and config.cwd else None,
                env=dict(config.envs),
                stdin=stdin,
            )
        except SandrlError as exc:
            raise connect_error(exc) from exc
        tracked = Tracked(table, proc, config, request.tag if request.has_field("tag") else None, stdin)
        table.add(tracked)
        queue = tracked.watch()
        with svc.busy(entry):
            yield pb.StartResponse(event=_start_event(tracked.pid))
            async for event in self._follow(tracked, queue, ctx, kill_at_deadline=True):
                yield pb.StartResponse(event=event)
        svc.metrics.exec_seconds.observe(time.monotonic() - tracked.started)

    async def connect(
        self, request: pb.ConnectRequest, ctx: RequestContext[pb.ConnectRequest, pb.ConnectResponse]
    ) -> AsyncIterator[pb.ConnectResponse]:
        _, _, table = self._sandbox(ctx)
        tracked = table.select(request.process)
        queue = tracked.watch()
        yield pb.ConnectResponse(event=_start_event(tracked.pid))
        async for event in self._follow(tracked, queue, ctx, kill_at_deadline=False):
            yield pb.ConnectResponse(event=event)

    async def _follow(
        self,
        tracked: Tracked,
        queue: asyncio.Queue[Item],
        ctx: RequestContext[Any, Any],
        *,
        kill_at_deadline: bool,
    ) -> AsyncIterator[pb.ProcessEvent]:
        left_ms = ctx.timeout_ms
        deadline = None if left_ms is None else time.monotonic() + left_ms / 1000
        every = _keepalive_s(ctx)
        try:
            while True:
                wait = every if deadline is None else min(every, deadline - time.monotonic())
                try:
                    if wait <= 0:
                        raise TimeoutError
                    item = await asyncio.wait_for(queue.get(), wait)
                except TimeoutError:
                    if deadline is not None and time.monotonic() >= deadline:
                        break
                    yield _keepalive()
                    continue
                if item is None:
                    return
                yield item
        finally:
            tracked.unwatch(queue)
        seconds = 0.0 if left_ms is None else left_ms / 1000
        if kill_at_deadline and tracked.ended is None:
            with contextlib.suppress(Exception):
                await tracked.proc.signal(signal.SIGKILL)
            raise ConnectError(
                Code.DEADLINE_EXCEEDED,
                f"context deadline exceeded: the command ran past its timeout of {seconds:g} s and was killed",
            )
        raise ConnectError(Code.DEADLINE_EXCEEDED, f"context deadline exceeded after {seconds:g} s")

    async def update(
        self, request: pb.UpdateRequest, ctx: RequestContext[pb.UpdateRequest, pb.UpdateResponse]
    ) -> pb.UpdateResponse:
        self._sandbox(ctx)
        raise ConnectError(Code.UNIMPLEMENTED, "PTYs are not supported yet by sandrl, so there is no PTY to resize")

    async def stream_input(
        self,
        request: AsyncIterator[pb.StreamInputRequest],
        ctx: RequestContext[pb.StreamInputRequest, pb.StreamInputResponse],
    ) -> pb.StreamInputResponse:
        _, _, table = self._sandbox(ctx)
        tracked: Tracked | None = None
        async for message in request:
            event = message.event
            if event is None or event.field == "keepalive":
                continue
            if event.field == "start":
                tracked = table.select(event.value.process)
            elif event.field == "data":
                if tracked is None:
                    raise ConnectError(Code.FAILED_PRECONDITION, "the input stream sent data before its start event")
                await self._write(tracked, event.value.input)
        return pb.StreamInputResponse()

    async def send_input(
        self, request: pb.SendInputRequest, ctx: RequestContext[pb.SendInputRequest, pb.SendInputResponse]
    ) -> pb.SendInputResponse:
        _, _, table = self._sandbox(ctx)
        await self._write(table.select(request.process), request.input)
        return pb.SendInputResponse()

    async def _write(self, tracked: Tracked, given: pb.ProcessInput | None) -> None:
        data = given.input if given is not None else None
        if data is None:
            return
        if data.field == "pty":
            raise ConnectError(Code.UNIMPLEMENTED, "PTYs are not supported yet by sandrl: send stdin instead")
        if not tracked.stdin:
            raise ConnectError(
                Code.FAILED_PRECONDITION, f"process {tracked.pid} was started without stdin: run it with stdin=True"
            )
        try:
            await tracked.proc.write_stdin(bytes(data.value))
        except SandrlError as exc:
            raise connect_error(exc) from exc

    async def send_signal(
        self, request: pb.SendSignalRequest, ctx: RequestContext[pb.SendSignalRequest, pb.SendSignalResponse]
    ) -> pb.SendSignalResponse:
        _, _, table = self._sandbox(ctx)
        tracked = table.select(request.process)
        signum = _SIGNALS.get(request.signal)
        if signum is None:
            raise ConnectError(Code.INVALID_ARGUMENT, f"unknown signal {request.signal!r}: send SIGTERM or SIGKILL")
        await tracked.proc.signal(signum)
        return pb.SendSignalResponse()

    async def close_stdin(
        self, request: pb.CloseStdinRequest, ctx: RequestContext[pb.CloseStdinRequest, pb.CloseStdinResponse]
    ) -> pb.CloseStdinResponse:
        _, _, table = self._sandbox(ctx)
        tracked = table.select(request.process)
        if not tracked.stdin:
            raise ConnectError(
                Code.FAILED_PRECONDITION, f"process {tracked.pid} was started without stdin: run it with stdin=True"
            )
        await tracked.proc.close_stdin()
        return pb.CloseStdinResponse()
