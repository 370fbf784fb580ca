"""Ending a child process: politely first, then for sure."""

from __future__ import annotations

import subprocess

__all__ = ["stop_process"]


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
