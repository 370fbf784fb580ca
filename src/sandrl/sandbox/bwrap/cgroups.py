"""Per-sandbox cgroups: memory, pids and CPU limits, usage, and killing a whole sandbox.

Both cgroup versions are supported, chosen at run time from what ``/sys/fs/cgroup`` is:

- **v2** (unified): one group per sandbox with ``memory.max``, ``pids.max``, ``cpu.max``;
  ``cgroup.kill`` kills it whole.
- **v1** (one hierarchy per controller): a group in each of ``memory``, ``pids``, ``cpu``,
  ``cpuacct``. A hybrid host's cgroup2 mount at ``/sys/fs/cgroup/unified`` usually holds no
  controllers, but its groups still have ``cgroup.kill``, so sandrl makes a group there too.

Groups are made under the provider's *own* group in each hierarchy (plus ``/sandrl``): a
memory controller only lets a process create children of its own group.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from sandrl.errors import LimitUnsupportedError

N = TypeVar("N", int, float)

CFS_PERIOD_US = 100_000
V1_CONTROLLERS = ("memory", "pids", "cpu", "cpuacct")
MAX_GROUP_DEPTH = 12
"""How deep under a hierarchy's root :meth:`CgroupManager.groups_anywhere` looks for ``sandrl`` parents."""
MAX_WALKED_GROUPS = 50_000
"""How many groups it looks at, at most (a host has hundreds)."""
_STATE_PARENT = re.compile(r"sandrl-[0-9a-f]{12}")
"""A state directory's parent group (:attr:`sandrl.sandbox.bwrap.state.StateDir.cgroup_name`)."""


def _own_groups(proc_cgroup: str) -> dict[str, str]:
    """Map each controller (and "" for the v2 hierarchy) to this process's group path."""
    groups: dict[str, str] = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for name in controllers.split(",") if controllers else [""]:
            groups[name] = path
    return groups


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


@dataclass(frozen=True)
class SandboxStats:
    """What a sandbox's cgroup has used (each 0 where the kernel does not say)."""

    memory_bytes: int
    kernel_memory_bytes: int
    memory_peak_bytes: int
    cpu_s: float
    pids: int
    oom_kills: int
    memory_cache_bytes: int = 0
    """Reclaimable page cache within ``memory_bytes`` (the writable layer's pages are not)."""


@dataclass
class SandboxCgroup:
    """The groups of one sandbox."""

    name: str
    dirs: list[Path]
    memory: Path | None
    pids: Path | None
    cpu: Path | None
    cpuacct: Path | None
    kill_dir: Path | None
    """A group whose ``cgroup.kill`` kills the sandbox whole, where the host has one."""
    version: int

    @property
    def procs_files(self) -> list[Path]:
        return [d / "cgroup.procs" for d in self.dirs]

    def processes(self) -> set[int]:
        pids: set[int] = set()
        for f in self.procs_files:
            with contextlib.suppress(OSError):
                pids.update(int(x) for x in f.read_text().split())
        return pids

    def memory_bytes(self) -> int:
        if self.memory is None:
            return 0
        name = "memory.current" if self.version == 2 else "memory.usage_in_bytes"
        return int((self.memory / name).read_text())

    def kernel_memory_bytes(self) -> int:
        """The kernel's share of :meth:`memory_bytes` (page tables, slabs, socket buffers, stacks)."""
        if self.memory is None:
            return 0
        if self.version == 2:
            for line in (self.memory / "memory.stat").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "kernel":
                    return int(value)
            return 0
        return int((self.memory / "memory.kmem.usage_in_bytes").read_text())

    def memory_cache_bytes(self) -> int:
        """The reclaimable page cache in :meth:`memory_bytes`: file pages, less tmpfs pages (``shmem``,
        the writable layer among them), which cannot be dropped while their files exist."""
        if self.memory is None:
            return 0
        stat: dict[str, int] = {}
        for line in (self.memory / "memory.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            with contextlib.suppress(ValueError):
                stat[key] = int(value)
        if self.version == 2:
            return max(0, stat.get("file", 0) - stat.get("shmem", 0))
        return max(0, stat.get("total_cache", 0) - stat.get("total_shmem", 0))

    def memory_peak_bytes(self) -> int:
        if self.memory is None:
            return 0
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        with contextlib.suppress(OSError):
            return int((self.memory / name).read_text())
        return 0

    def oom_kills(self) -> int:
        if self.memory is None:
            return 0
        if self.version == 2:
            for line in (self.memory / "memory.events").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
            return 0
        for line in (self.memory / "memory.oom_control").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def cpu_seconds(self) -> float:
        if self.version == 2 and self.cpu is not None:
            for line in (self.cpu / "cpu.stat").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) / 1e6
            return 0.0
        if self.cpuacct is not None:
            return int((self.cpuacct / "cpuacct.usage").read_text()) / 1e9
        return 0.0

    def pids_current(self) -> int:
        if self.pids is None:
            return 0
        return int((self.pids / "pids.current").read_text())

    def stats(self) -> SandboxStats:
        return SandboxStats(
            memory_bytes=_safe(self.memory_bytes),
            kernel_memory_bytes=_safe(self.kernel_memory_bytes),
            memory_peak_bytes=_safe(self.memory_peak_bytes),
            cpu_s=_safe(self.cpu_seconds),
            pids=_safe(self.pids_current),
            oom_kills=_safe(self.oom_kills),
            memory_cache_bytes=_safe(self.memory_cache_bytes),
        )

    def kill(self) -> None:
        """SIGKILL every process in the sandbox's groups."""
        if self.kill_dir is not None:
            with contextlib.suppress(OSError):
                _write(self.kill_dir / "cgroup.kill", "1")
                return
        for pid in self.processes():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def freeze(self, frozen: bool, timeout_s: float = 5.0) -> None:
        """Freeze (or thaw) every process of the sandbox at once (cgroup v2's ``cgroup.freeze``, which a
        hybrid host's unified group has too); returns when the kernel says it is done."""
        if self.kill_dir is None or not (self.kill_dir / "cgroup.freeze").exists():
            raise LimitUnsupportedError(
                "this host's cgroups have no freezer for sandboxes (cgroup v2's cgroup.freeze, or a hybrid "
                "host's /sys/fs/cgroup/unified): pause and snapshot need it"
            )
        _write(self.kill_dir / "cgroup.freeze", "1" if frozen else "0")
        want = f"frozen {int(frozen)}"
        deadline = time.monotonic() + timeout_s
        while want not in (self.kill_dir / "cgroup.events").read_text().splitlines():
            if time.monotonic() > deadline:
                raise LimitUnsupportedError(f"the sandbox's cgroup did not become {want!r} within {timeout_s:g} s")
            time.sleep(0.0005)

    def remove(self, timeout_s: float = 10.0) -> bool:
        """Kill what is left and remove the groups; False if some could not be removed in time (10 s
        by default: processes stuck in the kernel; a sandbox's close and an undone launch both wait
        that long, on ``HOST_CLEANUP``)."""
        deadline = time.monotonic() + timeout_s
        pending = list(self.dirs)
        while pending:
            still: list[Path] = []
            for d in pending:
                try:
                    d.rmdir()
                except FileNotFoundError:
                    pass
                except OSError:
                    still.append(d)
            if not still:
                return True
            if time.monotonic() > deadline:
                return False
            self.kill()
            time.sleep(0.002)
            pending = still
        return True


@dataclass
class CgroupManager:
    """Finds the hierarchies once and makes groups for sandboxes under ``<own group>/sandrl``."""

    root: Path = Path("/sys/fs/cgroup")
    proc_cgroup: str | None = None
    subdir: str = "sandrl"
    version: int = field(init=False)
    bases: dict[str, Path] = field(init=False, default_factory=dict)
    kill_base: Path | None = field(init=False, default=None)
    own_v2: Path | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        own = _own_groups(self.proc_cgroup if self.proc_cgroup is not None else Path("/proc/self/cgroup").read_text())
        if (self.root / "cgroup.controllers").exists():
            self.version = 2
            self.own_v2 = self.root / own.get("", "/").lstrip("/")
            base = self.own_v2 / self.subdir
            self.bases["unified"] = base
            self.kill_base = base
        else:
            self.version = 1
            for ctrl in V1_CONTROLLERS:
                mount = self.root / ctrl
                if (mount / "cgroup.procs").exists():
                    self.bases[ctrl] = mount / own.get(ctrl, "/").lstrip("/") / self.subdir
            unified = self.root / "unified"
            if (unified / "cgroup.procs").exists():
                self.kill_base = unified / own.get("", "/").lstrip("/") / self.subdir

    def missing(self) -> list[str]:
        """The limits (memory, pids, cpu) that cannot be enforced here."""
        if self.version == 2:
            assert self.own_v2 is not None
            try:
                available = set((self.own_v2 / "cgroup.controllers").read_text().split())
            except OSError:
                available = set()
        else:
            available = set(self.bases)
        return [c for c in ("memory", "pids", "cpu") if c not in available]

    def prepare(self) -> None:
        """Make the ``sandrl`` parent groups (and, on v2, delegate the controllers to them)."""
        try:
            for base in self.bases.values():
                base.mkdir(parents=True, exist_ok=True)
            if self.kill_base is not None:
                self.kill_base.mkdir(parents=True, exist_ok=True)
            if self.version == 2:
                self._delegate_v2(self.bases["unified"])
            self._remove_empty_siblings()
        except OSError as exc:
            raise LimitUnsupportedError(
                f"cannot set up cgroups under {self.root} ({exc}); run as root on a host with cgroups "
                "(on cgroup v2, from a group whose controllers are delegated, e.g. "
                "`systemd-run --scope -p Delegate=yes ...`), or set require_limits=False"
            ) from exc

    def _bases(self) -> list[Path]:
        bases = list(self.bases.values())
        if self.kill_base is not None and self.kill_base not in bases:
            bases.append(self.kill_base)
        return bases

    def _remove_empty_siblings(self) -> None:
        """Remove the parents other state directories left (one per temporary state root, say).

        Only empty ones go: the kernel refuses to remove a group that still has a child group or
        a process. A live provider whose parent was removed while it had no sandbox makes it
        again on its next :meth:`create`.
        """
        # A parent made (or made again) within the last minute belongs to a provider about to use it:
        # removing it races that provider's next create, which many providers starting at once lose.
        young = time.time() - 60
        for base in self._bases():
            if not _STATE_PARENT.fullmatch(base.name):
                continue
            with contextlib.suppress(OSError):
                for sibling in base.parent.iterdir():
                    if sibling != base and _STATE_PARENT.fullmatch(sibling.name) and sibling.is_dir():
                        with contextlib.suppress(OSError):
                            if sibling.stat().st_mtime < young:
                                sibling.rmdir()

    def _delegate_v2(self, base: Path) -> None:
        """Enable memory, pids and cpu for the sandboxes' groups.

        A v2 group may not both hold processes and hand controllers to its children, so if
        the provider's own group has processes they move to a leaf ``sandrl-provider`` first.
        """
        own = self.own_v2
        assert own is not None
        wanted = {"memory", "pids", "cpu"} & set((own / "cgroup.controllers").read_text().split())
        if not wanted:
            return
        enable = " ".join(f"+{c}" for c in sorted(wanted))
        if own != self.root:
            try:
                _write(own / "cgroup.subtree_control", enable)
            except OSError:
                leaf = own / "sandrl-provider"
                leaf.mkdir(exist_ok=True)
                for pid in (own / "cgroup.procs").read_text().split():
                    with contextlib.suppress(OSError):
                        _write(leaf / "cgroup.procs", pid)
                _write(own / "cgroup.subtree_control", enable)
        level = own
        for part in base.relative_to(own).parts:
            level = level / part
            _write(level / "cgroup.subtree_control", enable)

    def create(self, name: str, *, memory_mb: int | None, pids: int | None, cpus: float | None) -> SandboxCgroup:
        for _ in range(3):
            try:
                return self._create(name, memory_mb=memory_mb, pids=pids, cpus=cpus)
            except FileNotFoundError:
                # Another provider's prepare() removed our parent while it was empty.
                self.prepare()
        return self._create(name, memory_mb=memory_mb, pids=pids, cpus=cpus)

    def _create(self, name: str, *, memory_mb: int | None, pids: int | None, cpus: float | None) -> SandboxCgroup:
        dirs: list[Path] = []
        paths: dict[str, Path] = {}
        try:
            for ctrl, base in self.bases.items():
                d = base / name
                d.mkdir()
                dirs.append(d)
                paths[ctrl] = d
            kill_dir = None
            if self.kill_base is not None and self.version == 1:
                kill_dir = self.kill_base / name
                kill_dir.mkdir()
                dirs.append(kill_dir)
            elif self.version == 2:
                kill_dir = paths["unified"]
            group = SandboxCgroup(
                name=name,
                dirs=dirs,
                memory=paths.get("memory", paths.get("unified")),
                pids=paths.get("pids", paths.get("unified")),
                cpu=paths.get("cpu", paths.get("unified")),
                cpuacct=paths.get("cpuacct"),
                kill_dir=kill_dir,
                version=self.version,
            )
            self.set_limits(group, memory_mb=memory_mb, pids=pids, cpus=cpus)
            return group
        except BaseException:
            for d in reversed(dirs):
                with contextlib.suppress(OSError):
                    d.rmdir()
            raise

    def set_limits(self, group: SandboxCgroup, *, memory_mb: int | None, pids: int | None, cpus: float | None) -> None:
        """Write the group's limits (None: leave that one as it is)."""
        if self.version == 2:
            d = group.memory
            assert d is not None
            if memory_mb is not None:
                _write(d / "memory.max", str(memory_mb << 20))
                with contextlib.suppress(OSError):
                    _write(d / "memory.swap.max", "0")
            if pids is not None:
                _write(d / "pids.max", str(pids))
            if cpus is not None:
                _write(d / "cpu.max", f"{round(cpus * CFS_PERIOD_US)} {CFS_PERIOD_US}")
            return
        if memory_mb is not None and group.memory is not None:
            _write(group.memory / "memory.limit_in_bytes", str(memory_mb << 20))
            memsw = group.memory / "memory.memsw.limit_in_bytes"
            if memsw.exists():
                # Without this a hog would page out to swap instead of being OOM-killed.
                with contextlib.suppress(OSError):
                    _write(memsw, str(memory_mb << 20))
        if pids is not None and group.pids is not None:
            _write(group.pids / "pids.max", str(pids))
        if cpus is not None and group.cpu is not None:
            # Each write of either file checks every CPU group of the host (the kernel's walk of its
            # task-group tree, ~1 us a group): a new group's period is this one already, so the period
            # is written only where it is not, one walk per create instead of two.
            period = group.cpu / "cpu.cfs_period_us"
            if _safe(lambda: int(period.read_text())) != CFS_PERIOD_US:
                _write(period, str(CFS_PERIOD_US))
            _write(group.cpu / "cpu.cfs_quota_us", str(round(cpus * CFS_PERIOD_US)))

    def stale_groups(self) -> dict[str, list[Path]]:
        """Sandbox groups present under the ``sandrl`` parents, by sandbox name."""
        found: dict[str, list[Path]] = {}
        for base in self._bases():
            with contextlib.suppress(OSError):
                for d in base.iterdir():
                    if d.is_dir():
                        found.setdefault(d.name, []).append(d)
        return found

    def groups_anywhere(self) -> dict[str, list[Path]]:
        """:meth:`stale_groups` found under every group of the host, not only under this process's.

        A provider makes its sandboxes' groups under its own group (a memory controller allows
        nothing else), so providers started from other groups (another login session, a service,
        a job) keep theirs elsewhere: ``sandrl sandbox ls|gc`` must find them all. The walk stops
        at every ``sandrl`` parent (sandboxes' groups are not searched) and after
        :data:`MAX_WALKED_GROUPS` groups."""
        found = self.stale_groups()
        seen = {d for dirs in found.values() for d in dirs}
        head = Path(self.subdir).parts[0]
        walked = 0
        for top in self._hierarchies():
            pending = [(top, 0)]
            while pending and walked < MAX_WALKED_GROUPS:
                d, depth = pending.pop()
                walked += 1
                with contextlib.suppress(OSError):
                    for child in (d / self.subdir).iterdir():
                        if child.is_dir() and child not in seen:
                            seen.add(child)
                            found.setdefault(child.name, []).append(child)
                if depth >= MAX_GROUP_DEPTH:
                    continue
                with contextlib.suppress(OSError):
                    pending += [(e, depth + 1) for e in d.iterdir() if e.name != head and e.is_dir()]
        return found

    def _hierarchies(self) -> list[Path]:
        """The mount points of the hierarchies sandboxes' groups are made in."""
        if self.version == 2:
            return [self.root]
        return [self.root / c for c in (*V1_CONTROLLERS, "unified") if (self.root / c / "cgroup.procs").exists()]


def remove_group_dir(d: Path) -> None:
    """Kill what is in a leftover group and remove it (gone already: nothing to do)."""
    for _ in range(500):
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            try:
                _write(d / "cgroup.kill", "1")
            except OSError:
                with contextlib.suppress(OSError):
                    for pid in (d / "cgroup.procs").read_text().split():
                        with contextlib.suppress(OSError):
                            os.kill(int(pid), signal.SIGKILL)
            time.sleep(0.002)


def _safe(read: Callable[[], N]) -> N | int:
    """``read()``, or 0 when the cgroup's file is gone or holds no number."""
    try:
        return read()
    except (OSError, ValueError):
        return 0
