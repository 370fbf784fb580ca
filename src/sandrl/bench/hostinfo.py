"""What machine a benchmark ran on: CPU model, cores, memory, kernel, sandbox backend.

Every benchmark result carries :func:`describe`'s dictionary under ``"host"`` so two result
files from two machines can be compared knowing what each was.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any


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
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    except OSError:
        return None
    return None


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
        "host_limit": limit or {"mode": "none"},
    }
