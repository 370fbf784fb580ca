"""Issue #18 (6), the E2B side: a stream watching a command that does not read holds the command back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from sandrl.sandbox.base import ExecResult, OutputChunk
from sandrl.sandbox.service.e2b.process_table import WATCH_QUEUE_ITEMS, ProcessTable, Tracked
from sandrl.sandbox.service.e2b.proto import process_pb as pb


class Chatty:
    """A command with endless output that counts how much of it was taken from it."""

    pid = 7

    def __init__(self, chunks: int) -> None:
        self.chunks = chunks
        self.taken = 0

    async def output(self) -> AsyncIterator[OutputChunk]:
        for _ in range(self.chunks):
            self.taken += 1
            yield OutputChunk("stdout", b"x" * 65536)
            await asyncio.sleep(0)

    async def wait(self) -> ExecResult:
        return ExecResult(exit_code=0, stdout="", stderr="", duration_s=0.0, timed_out=False, truncated=False)

    async def write_stdin(self, data: bytes) -> None: ...
    async def close_stdin(self) -> None: ...
    async def signal(self, signum: int) -> None: ...
    async def kill(self) -> None: ...


async def test_a_watcher_that_does_not_read_holds_the_command_back() -> None:
    proc = Chatty(chunks=10_000)
    table = ProcessTable()
    tracked = Tracked(table, proc, pb.ProcessConfig(cmd="yes"), None, False)  # type: ignore[arg-type]
    table.add(tracked)
    queue = tracked.watch()
    await asyncio.sleep(0.5)
    assert queue.qsize() <= WATCH_QUEUE_ITEMS
    assert proc.taken <= WATCH_QUEUE_ITEMS + 2  # not 10 000 chunks (625 MiB) held for nobody
    tracked.unwatch(queue)  # the stream went away: the command runs on unwatched
    await asyncio.wait_for(tracked._pump, 10)
    assert proc.taken == 10_000
    assert tracked.ended is not None
