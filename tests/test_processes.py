"""Child processes are always reaped: a caller that gives up waiting hands the child to a reaper thread."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import subprocess
import time

from sandrl.processes import reap_in_background, wait_readable


def test_a_child_handed_to_the_reaper_is_reaped_without_a_resource_warning() -> None:
    child = subprocess.Popen(["sleep", "0.3"])
    pid = child.pid
    reap_in_background(child)
    del child
    gc.collect()  # pytest turns a "subprocess is still running" ResourceWarning into an error
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # reaped by the thread: no zombie left behind
            return
        time.sleep(0.02)
    raise AssertionError(f"child {pid} was not reaped")


def test_a_child_that_already_exited_starts_no_thread() -> None:
    child = subprocess.Popen(["true"])
    child.wait()
    reap_in_background(child)
    assert child.returncode == 0


async def test_wait_readable_returns_once_there_is_something_to_read_and_a_cancel_leaves_no_reader() -> None:
    r, w = os.pipe()
    cancelled = asyncio.create_task(wait_readable(r))
    await asyncio.sleep(0.02)
    cancelled.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await cancelled
    try:
        waiting = asyncio.create_task(wait_readable(r))
        await asyncio.sleep(0.02)
        assert not waiting.done()
        os.write(w, b"x")
        await asyncio.wait_for(waiting, 5)
        assert os.read(r, 1) == b"x"  # nothing else (the cancelled wait) read it first
    finally:
        os.close(r)
        os.close(w)
