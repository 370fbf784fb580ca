"""Ending a child process: politely first, then for sure; waiting for one to end without polling."""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
import time

__all__ = ["reap_in_background", "stop_process", "wait_exited"]


def stop_process(process: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``grace_s``; reaped either way. Safe to call twice."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def reap_in_background(process: subprocess.Popen[bytes]) -> None:
    """Wait for a killed ``process`` in a daemon thread: on a loaded host a SIGKILLed child can take
    seconds to tear its namespaces down, and a caller that cannot wait that long must still reap it
    (no zombie, and no ``Popen`` dropped while it runs)."""
    if process.poll() is None:
        threading.Thread(target=process.wait, name=f"sandrl-reap-{process.pid}", daemon=True).start()


async def wait_exited(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Wait up to ``timeout_s`` for ``proc`` to exit, woken by its pidfd rather than by polling."""
    if proc.poll() is not None:
        return
    try:
        fd = os.pidfd_open(proc.pid)
    except OSError:  # gone already, or a kernel without pidfds (< 5.3): poll
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.002)
        return
    try:
        async with asyncio.timeout(timeout_s):
            await wait_readable(fd)
    except TimeoutError:
        pass
    finally:
        os.close(fd)


async def wait_readable(fd: int) -> None:
    """Wait until ``fd`` is readable (or at its end), on the event loop: no thread is left blocked in a
    ``read`` of it when the wait is cancelled, so the caller may close it at once."""
    loop = asyncio.get_running_loop()
    readable = loop.create_future()
    loop.add_reader(fd, _set_once, readable)
    try:
        await readable
    finally:
        loop.remove_reader(fd)


def _set_once(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
