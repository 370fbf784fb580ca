"""The watchdog between the driver and one engine: no engine outlives the driver, ``kill -9`` included.

Run as a script (``python guard.py DRIVER_PID GRACE_S -- ENGINE ARGV...``; it imports only the
standard library, so it starts in milliseconds). It:

1. asks the kernel for SIGTERM when its parent dies (``prctl(PR_SET_PDEATHSIG)``), then checks that
   its parent is still ``DRIVER_PID`` (a driver killed before the ``prctl`` left it to init);
2. starts the engine in a process group of its own (a new session), with SIGKILL as the engine's
   own parent-death signal: a guard killed outright takes its engine with it;
3. waits. When the engine exits, the guard kills what is left of the engine's group and exits with
   the engine's status (the launcher then restarts it). On SIGTERM or SIGHUP (the launcher stopping
   the run, or the driver's death by any signal), or when its parent is no longer the driver (polled
   five times a second, in case the signal was missed), it sends SIGTERM to the engine's whole group,
   waits ``GRACE_S`` seconds, then SIGKILLs the group.

Why a separate process rather than the parent-death signal set in the driver: the driver is
multi-threaded (PyTorch), where ``preexec_fn`` is unsafe; and SGLang and vLLM run their own child
processes (schedulers, tensor-parallel workers), which the group kill reaches. The guard ignores
SIGINT: Ctrl-C at a terminal is the driver's to handle (it stops the engines as it unwinds).
A grandchild that leaves the engine's process group on purpose (``setsid``) is out of reach; SGLang's
and vLLM's workers do not.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1
POLL_S = 0.2
"""How often the guard looks for a stop request and for its parent."""


def _set_parent_death_signal(signum: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def _engine_dies_with_guard() -> None:  # the guard is single-threaded: preexec_fn is safe here
    _set_parent_death_signal(signal.SIGKILL)


def _kill_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _stop(engine: subprocess.Popen[bytes], grace_s: float) -> None:
    _kill_group(engine.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        engine.wait(timeout=grace_s)
    _kill_group(engine.pid, signal.SIGKILL)
    engine.wait()


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        sys.stderr.write("usage: guard.py DRIVER_PID GRACE_S -- ENGINE ARGV...\n")
        return 2
    driver, grace_s, command = int(argv[0]), float(argv[1]), argv[3:]
    stopping: list[int] = []
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, lambda s, _f: stopping.append(s))
    _set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != driver:
        return 0  # the driver died before we could watch it: start nothing
    engine = subprocess.Popen(command, start_new_session=True, preexec_fn=_engine_dies_with_guard)
    while True:
        try:
            status = engine.wait(timeout=POLL_S)
        except subprocess.TimeoutExpired:
            if stopping or os.getppid() != driver:
                _stop(engine, grace_s)
                return 0
            continue
        _kill_group(engine.pid, signal.SIGKILL)  # whatever the engine left running in its group
        return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
