"""The commands envd tracks in one sandbox, by pid, each with the streams watching its output.

A started command's output is read by one pump task and fanned out to every stream watching it
(the ``Start`` stream and any ``Connect`` streams), so a client can disconnect and reconnect by
pid; a watcher that does not read holds the command back rather than this server's memory.
Used by :mod:`.processes` (the ``process.Process`` service) and kept per sandbox in its
:class:`~.state.E2BSandbox` record, which forgets the table when the sandbox goes.
"""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Literal, TypeAlias

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from protobuf import Oneof

from sandrl.errors import SandrlError
from sandrl.sandbox.base import ExecResult, SandboxProcess
from sandrl.sandbox.service.e2b.proto import process_pb as pb

Item: TypeAlias = pb.ProcessEvent | None


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
