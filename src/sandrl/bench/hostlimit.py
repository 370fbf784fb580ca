"""Emulate a smaller host on this one: all the benchmark's sandboxes together get ``cores`` CPUs.

Two ways, neither needing a change to the sandbox backend:

- ``affinity`` (whole numbers of cores): the benchmark process pins itself to ``cores`` of its
  CPUs before it creates sandboxes; every sandbox process inherits the mask (through the
  helper, bubblewrap and the agent), so they all share those cores, and ``nproc`` inside
  says so, as on a real host of that size. The benchmark's own (mostly waiting) process runs
  there too. A sandbox could widen its own mask with ``sched_setaffinity``; the workloads do
  not: this is an emulation, not a limit.
- ``quota`` (any size): a CFS quota of ``cores`` on the provider's parent cgroup, so the
  sandboxes' groups together get that much CPU time per period. Every core stays usable,
  in bursts: a quota is not fewer cores, and latencies differ from a real small host.

Either way each sandbox still has its own ``SandboxSpec.cpus`` quota underneath.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sandrl.bench import hostinfo
from sandrl.errors import ConfigError
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.sandbox.bwrap.cgroups import CFS_PERIOD_US
from sandrl.wiring.runner import local_provider

LimitMode = Literal["none", "affinity", "quota"]


@dataclass(frozen=True)
class HostLimit:
    cores: float
    """The emulated host's size in cores."""
    mode: LimitMode
    cpus: tuple[int, ...] = ()
    """The CPUs pinned to (``affinity``)."""

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "cores": self.cores, "cpus": list(self.cpus)}


def plan(
    cores: float | None, mode: Literal["auto", "affinity", "quota"] = "auto", *, sandbox_cpus: float = 1.0
) -> HostLimit:
    """How to give the sandboxes ``cores`` CPUs; ``None`` means every usable CPU, no limit.

    A quota must be at least each sandbox's own (``sandbox_cpus``): cgroup v1 refuses a child
    quota above its parent's, even that of a group just removed.
    """
    usable = sorted(os.sched_getaffinity(0))
    if cores is None:
        return HostLimit(float(len(usable)), "none")
    if not math.isfinite(cores) or cores <= 0 or cores > len(usable):
        raise ConfigError(f"--cpus-per-host must be more than 0 and at most {len(usable)} (this machine's CPUs)")
    whole = float(cores).is_integer()
    if mode == "affinity" and not whole:
        raise ConfigError("the affinity host limit needs a whole number of cores; use the quota mode for fractions")
    if mode == "quota" or (mode == "auto" and not whole):
        if cores < sandbox_cpus:
            raise ConfigError(
                f"a host quota of {cores:g} cores is below each sandbox's own quota of {sandbox_cpus:g}: "
                "use a whole number of cores (pinned), or give the sandboxes less CPU each"
            )
        return HostLimit(float(cores), "quota")
    if int(cores) == len(usable):
        return HostLimit(float(cores), "none")
    # The last CPUs: CPU 0 tends to take more interrupts and housekeeping.
    return HostLimit(float(cores), "affinity", tuple(usable[-int(cores) :]))


def _quota_files(provider: BwrapProvider) -> list[tuple[Path, str, str]]:
    """(file, limited value, unlimited value) for each hierarchy holding the CPU controller."""
    cg = provider.cgroups
    if cg.version == 2:
        base = cg.bases["unified"]
        return [(base / "cpu.max", "{quota} {period}", f"max {CFS_PERIOD_US}")]
    if "cpu" not in cg.bases:
        raise ConfigError("this host has no cpu cgroup controller: use --host-limit affinity")
    base = cg.bases["cpu"]
    return [(base / "cpu.cfs_period_us", "{period}", str(CFS_PERIOD_US)), (base / "cpu.cfs_quota_us", "{quota}", "-1")]


@contextlib.contextmanager
def applied(limit: HostLimit, provider: BwrapProvider) -> Iterator[None]:
    """Impose the limit for the duration of the block, and undo it after."""
    if limit.mode == "affinity":
        before = os.sched_getaffinity(0)
        os.sched_setaffinity(0, limit.cpus)
        try:
            yield
        finally:
            os.sched_setaffinity(0, before)
        return
    if limit.mode == "quota":
        files = _quota_files(provider)
        quota = round(limit.cores * CFS_PERIOD_US)
        try:
            for path, value, _ in files:
                path.write_text(value.format(quota=quota, period=CFS_PERIOD_US))
            yield
        finally:
            for path, _, unlimited in reversed(files):
                with contextlib.suppress(OSError):
                    path.write_text(unlimited)
        return
    yield


async def run_on_host(
    limit: HostLimit,
    body: Callable[[BwrapProvider, Path], Awaitable[dict[str, Any]]],
    *,
    provider: BwrapProvider | None = None,
    state_dir: Path | None = None,
) -> dict[str, Any]:
    """Run a benchmark's ``body(provider, scratch_dir)`` on the emulated host; its result, stamped.

    The provider is a new one (state under ``state_dir`` or the scratch dir) unless given; the
    limit holds for the body only; the result gets the ``host`` description and ``duration_s``.
    """
    with contextlib.ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sandrl-bench-")))
        if provider is None:
            provider = local_provider(state_dir or scratch / "state")
        stack.enter_context(applied(limit, provider))
        started = time.monotonic()
        result = await body(provider, scratch)
        result["host"] = hostinfo.describe(cores=limit.cores, limit=limit.to_dict())
        result["duration_s"] = round(time.monotonic() - started, 2)
    return result
