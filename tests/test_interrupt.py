"""sandrl.interrupt: SIGINT and SIGTERM cancel the command's coroutine, which cleans up; a second one stops at once.

The command is a small script in a subprocess (a signal to this test process would end the test run).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

SCRIPT = """
import asyncio, sys
from sandrl import interrupt

async def main(cleanup_s):
    print("running", flush=True)
    try:
        await asyncio.sleep(60)
    finally:
        await asyncio.sleep(cleanup_s)  # closing sandboxes, saving a checkpoint...
        print("cleaned up", flush=True)

try:
    interrupt.run(main(float(sys.argv[1])))
except interrupt.Interrupted as stop:
    print(f"interrupted by {stop.name}", flush=True)
    sys.exit(stop.exit_code)
"""


def start(cleanup_s: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(cleanup_s)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == "running\n"
    return proc


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_cancels_the_work_which_cleans_up_then_exits_128_plus_the_signal(
    signum: signal.Signals, code: int
) -> None:
    proc = start(0.1)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code
    assert out == f"cleaned up\ninterrupted by {signum.name}\n"
    assert err == ""  # a stop this quick says nothing more


def test_a_slow_stop_says_what_it_does_and_a_second_signal_stops_at_once() -> None:
    proc = start(60)
    proc.send_signal(signal.SIGTERM)
    assert proc.stderr is not None
    notice = proc.stderr.readline()
    assert notice.startswith("stopping (SIGTERM): closing sandboxes and saving what is done; send it again"), notice
    begun = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM  # the default action: no cleanup waited for
    assert time.monotonic() - begun < 10
    assert proc.stdout is not None and proc.stdout.read() == ""
    proc.stdout.close()
    proc.stderr.close()
