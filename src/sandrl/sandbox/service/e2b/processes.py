"""envd's ``process.Process`` service over sandrl sandboxes: start, stream, stdin, signals, list.

A started command is tracked by its pid inside the sandbox until it exits, its output fanned
out to every stream watching it (:mod:`.process_table`), so a client can disconnect and
reconnect by pid. The command runs as
``cmd args...`` (the SDK sends ``/bin/bash -l -c <command>``), an argv run directly as envd runs it
(no ``/bin/sh`` in front: :mod:`sandrl.sandbox.command`), with the sandbox's workdir as the default
cwd, as root.

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
import signal
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from protobuf import Oneof

from sandrl.errors import ConfigError, SandboxClosedError, SandrlError
from sandrl.sandbox.service.e2b.process_table import Item, ProcessTable, Tracked
from sandrl.sandbox.service.e2b.proto import process_pb as pb
from sandrl.sandbox.service.e2b.proto.process_connect import Process
from sandrl.sandbox.service.e2b.state import E2BRegistry, E2BSandbox, Refused, resolve
from sandrl.sandbox.service.state import Entry

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


def _keepalive_s(ctx: RequestContext[Any, Any]) -> float:
    try:
        value = float(ctx.request_headers.get("keepalive-ping-interval", DEFAULT_KEEPALIVE_S))
    except ValueError:
        value = DEFAULT_KEEPALIVE_S
    return min(max(value, 1.0), 300.0)


def _start_event(pid: int) -> pb.ProcessEvent:
    start = Oneof[Literal["start"], pb.ProcessEvent.StartEvent]("start", pb.ProcessEvent.StartEvent(pid=pid))
    return pb.ProcessEvent(event=start)


def _keepalive() -> pb.ProcessEvent:
    keep = Oneof[Literal["keepalive"], pb.ProcessEvent.KeepAlive]("keepalive", pb.ProcessEvent.KeepAlive())
    return pb.ProcessEvent(event=keep)


class ProcessService(Process):
    """The ``process.Process`` Connect service (see :mod:`.proto.process_connect`)."""

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
                [config.cmd, *config.args],
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
