"""Keep the host's cores awake while measuring, at no cost to the work measured.

On a virtual machine an idle vCPU halts, and waking it (an interrupt through the hypervisor)
takes tens to hundreds of microseconds; a short command whose processes hop between cores
(a shell pipeline, ``make -j``, a pytest start-up) pays that many times. A standalone time
taken on an idle host is therefore *inflated*, while under load every core is awake: commands
then look faster with every core busy than alone, and the slowdown hides what a busy core
really costs (shared caches, memory bandwidth). See the host-noise diagnosis in
:mod:`sandrl.bench.hostinfo`.

:class:`Spinners` runs one busy loop per core of the (emulated) host, each pinned to its core
under ``SCHED_IDLE``: the scheduler runs it only when nothing else wants that core, and a
waking task preempts it at once, so a core never halts and yet every real task keeps it. Its
cost is bounded by CFS weights (``SCHED_IDLE`` weighs 3 against a normal task's 1024: at
most 0.3% of a contended core) and measured: :meth:`Spinners.cpu_s` is the CPU time the loops
took, reported per level.

The weight alone is not enough under cgroups: a sandbox's group that just woke carries little
load history, and its share of a core is computed from that, so a root-level ``SCHED_IDLE``
loop measured here took 20-45% of a core from a command in a sandbox (cgroup v1). The loops
therefore get a group of their own beside the sandboxes' parent, at the least weight the
kernel allows (``cpu.shares`` 2; on v2 ``cpu.idle``): the group competes as the idle one it is.
Where no group can be made the loops run in the benchmark's and the result says so.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sandrl.bench.hostinfo import process_cpu_s
from sandrl.errors import ConfigError

SPIN = """import os, sys
cpu = int(sys.argv[1])
os.sched_setaffinity(0, {cpu})
os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
sys.stdout.write("ready\\n"); sys.stdout.flush()
while True:
    pass
"""
"""One loop: pin itself, drop to SCHED_IDLE, say so, then spin (no syscalls, no memory traffic)."""

POLICY = "SCHED_IDLE busy loop, one per core, pinned"
MAX_SHARE = 3 / (3 + 1024)
"""The most of a contended core a SCHED_IDLE task gets by CFS weight (3 against nice 0's 1024)."""


def make_group(parent: Path, name: str) -> Path | None:
    """A cgroup for the loops under ``parent`` (the cpu hierarchy's group holding the sandboxes'
    parent), at the least weight; None where it cannot be made (then the loops go without)."""
    group = parent / name
    try:
        group.mkdir(exist_ok=True)
        if (group / "cpu.shares").exists():
            (group / "cpu.shares").write_text("2")
        else:
            if (group / "cpu.weight").exists():
                (group / "cpu.weight").write_text("1")
            if (group / "cpu.idle").exists():
                (group / "cpu.idle").write_text("1")
    except OSError:
        with contextlib.suppress(OSError):
            group.rmdir()
        return None
    return group


@dataclass
class Spinners:
    """Busy loops on ``cpus`` (default: this process's CPUs, the emulated host's), in ``group``."""

    cpus: Sequence[int] = ()
    group: Path | None = None
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self) -> None:
        cpus = list(self.cpus) or sorted(os.sched_getaffinity(0))
        try:
            for cpu in cpus:
                proc = subprocess.Popen(
                    [sys.executable, "-c", SPIN, str(cpu)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                )
                self.procs.append(proc)
                if self.group is not None:
                    (self.group / "cgroup.procs").write_text(str(proc.pid))
                assert proc.stdout is not None
                if proc.stdout.readline().strip() != b"ready":
                    err = proc.stderr.read().decode(errors="replace")[-400:] if proc.stderr else ""
                    raise ConfigError(
                        f"the core-awake loop for CPU {cpu} did not start ({err.strip() or 'no output'}); "
                        "run with --idle-only to measure without it"
                    )
        except BaseException:
            self.stop()
            raise

    def cpu_s(self) -> float:
        """CPU seconds the loops have taken so far."""
        total = 0.0
        for proc in self.procs:
            with contextlib.suppress(OSError, ValueError):
                total += process_cpu_s(proc.pid)
        return total

    def stop(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGKILL)
        for proc in self.procs:
            proc.wait()
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        self.procs.clear()


@contextlib.contextmanager
def awake(enabled: bool = True, cpus: Sequence[int] = (), group: Path | None = None) -> Iterator[Spinners | None]:
    """The loops for the duration of the block (None when not ``enabled``)."""
    if not enabled:
        yield None
        return
    spinners = Spinners(cpus, group)
    spinners.start()
    try:
        yield spinners
    finally:
        spinners.stop()
