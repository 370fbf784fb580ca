"""What machine a benchmark ran on: CPU model, cores, memory, kernel, sandbox backend; and what
its CPUs are doing (busy, stolen by the hypervisor, their frequency), to tell a noisy host.

Every benchmark result carries :func:`describe`'s dictionary under ``"host"`` so two result
files from two machines can be compared knowing what each was.
"""

from __future__ import annotations

import math
import os
import platform
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandrl.host_memory import meminfo_kb
from sandrl.sandbox.idle_cpu import IDLE_FIELDS, cpu_counters


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (x86 ``model name``, arm ``CPU part``...)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return platform.processor() or "unknown"
    for key in ("model name", "Hardware", "Processor", "cpu model", "uarch"):
        for line in cpuinfo.splitlines():
            name, _, value = line.partition(":")
            if name.strip() == key and value.strip():
                return value.strip()
    return platform.processor() or "unknown"


def memory_mib() -> int | None:
    kb = meminfo_kb("MemTotal")
    return None if kb is None else kb // 1024


def usable_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity mask)."""
    return sorted(os.sched_getaffinity(0))


def cgroup_version(root: Path = Path("/sys/fs/cgroup")) -> int:
    return 2 if (root / "cgroup.controllers").exists() else 1


def describe(*, cores: float | None = None, limit: dict[str, Any] | None = None) -> dict[str, Any]:
    """The host description of a result.

    ``cores`` is the number of cores the benchmark's sandboxes could use (the emulated host's
    size, see :mod:`sandrl.bench.hostlimit`); by default, every usable CPU. ``limit`` says how
    that size was imposed, when it was.
    """
    uname = os.uname()
    usable = usable_cpus()
    return {
        "hostname": uname.nodename,
        "cpu_model": cpu_model(),
        "machine_cpus": os.cpu_count(),
        "usable_cpus": len(usable),
        "cores": float(cores) if cores is not None else float(len(usable)),
        "memory_mib": memory_mib(),
        "kernel": f"{uname.sysname} {uname.release}",
        "arch": uname.machine,
        "python": platform.python_version(),
        "sandbox_backend": "bwrap",
        "cgroup_version": cgroup_version(),
        "cpuidle_driver": cpuidle_driver(),
        "cpufreq_exposed": cpu_freq_mhz() is not None,
        "host_limit": limit or {"mode": "none"},
    }


_BUSY_FIELDS = (0, 1, 2, 5, 6)
"""user, nice, system, irq, softirq among a ``cpuN`` line's counters (guest time is in user)."""
_STEAL_FIELD = 7


@dataclass(frozen=True)
class CpuTimes:
    """``/proc/stat`` ticks summed over some CPUs, at a moment."""

    busy: int
    idle: int
    steal: int
    at: float

    def since(self, before: CpuTimes) -> dict[str, float]:
        """What the CPUs did from ``before`` to this reading: cores busy (everything the host ran,
        ours included) and the share of their time the hypervisor took (steal)."""
        wall = self.at - before.at
        busy, idle, steal = self.busy - before.busy, self.idle - before.idle, self.steal - before.steal
        total = busy + idle + steal
        hz = os.sysconf("SC_CLK_TCK")
        return {
            "wall_s": round(wall, 3),
            "busy_cores": round(busy / hz / wall, 3) if wall > 0 else math.nan,
            "steal_share": round(steal / total, 4) if total > 0 else 0.0,
        }


def cpu_times(cpus: Iterable[int] | None = None, path: Path = Path("/proc/stat")) -> CpuTimes:
    """The ``/proc/stat`` counters of ``cpus`` (default: this process's CPUs, the emulated host's)."""
    busy = idle = steal = 0
    for counters in cpu_counters(usable_cpus() if cpus is None else cpus, path):
        busy += sum(counters[i] for i in _BUSY_FIELDS if i < len(counters))
        idle += sum(counters[i] for i in IDLE_FIELDS if i < len(counters))
        steal += counters[_STEAL_FIELD] if len(counters) > _STEAL_FIELD else 0
    return CpuTimes(busy, idle, steal, time.monotonic())


def cpu_freq_mhz(cpus: Iterable[int] | None = None) -> dict[int, float] | None:
    """Each CPU's current frequency from cpufreq; None where the kernel exposes none (most VMs)."""
    out = {}
    for cpu in usable_cpus() if cpus is None else cpus:
        path = Path(f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_cur_freq")
        try:
            out[cpu] = int(path.read_text().strip()) / 1000
        except (OSError, ValueError):
            continue
    return out or None


def cpuidle_driver() -> str | None:
    """The idle driver (``haltpoll`` on a KVM guest that polls before halting, ``intel_idle``...)."""
    try:
        return Path("/sys/devices/system/cpu/cpuidle/current_driver").read_text().strip() or None
    except OSError:
        return None


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far (``/proc/PID/stat`` fields 14 and 15).

    Raises OSError when it is gone."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()  # the command name may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
