"""What 10,000 live sandboxes on one host need of the provider's bookkeeping (issue #45, item 3).

``sandrl bench density`` (and ``tests/bench/test_density.py``) fill a host; these hold the limits
and per-create costs that grew with the number of live sandboxes to what was fixed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import resource
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from sandrl.errors import SandboxClosedError
from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider, BwrapSandbox, cgroups
from sandrl.sandbox.bwrap.provider import FD_LIMIT
from sandrl.sandbox.bwrap.sandbox import UPPER_DIR
from sandrl.sandbox.bwrap.state import DEFAULT_SLOTS, DEFAULT_UID_BASE, MAX_SLOTS, SLOT_STRIDE, UID_RANGE


def test_slots_for_ten_thousand_live_sandboxes_within_the_uid_space() -> None:
    # 4,096 slots refused the 4,097th live sandbox of a host, whatever its memory.
    assert DEFAULT_SLOTS >= 10_000
    assert DEFAULT_SLOTS <= MAX_SLOTS
    last_uid = DEFAULT_UID_BASE + (DEFAULT_SLOTS - 1) * SLOT_STRIDE + UID_RANGE
    assert last_uid < 0xFFFFFFFF  # (uid_t)-1 is no uid


def test_fd_limit_raised_for_a_socket_per_live_sandbox(provider: BwrapProvider) -> None:
    with open("/proc/sys/fs/nr_open") as f:
        nr_open = int(f.read())
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert soft == hard
    if _has_cap(CAP_SYS_RESOURCE):  # raising the hard limit needs it (a container may not grant it)
        assert hard >= min(FD_LIMIT, nr_open)


CAP_SYS_RESOURCE = 24


def _has_cap(cap: int) -> bool:
    with open("/proc/self/status") as f:
        eff = next(int(line.split()[1], 16) for line in f if line.startswith("CapEff:"))
    return bool(eff >> cap & 1)


def test_a_cpu_limit_is_one_bandwidth_write(provider: BwrapProvider, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each write of a CPU group's period or quota makes the kernel check every CPU group of the host
    (``tg_set_cfs_bandwidth``'s walk of the task-group tree): O(live sandboxes) per write, so a create
    writes only the quota where the new group's period is the default already."""
    if provider.cgroups.version != 1 or "cpu" not in provider.cgroups.bases:
        pytest.skip("a cgroup v1 cpu hierarchy (cgroup v2 writes cpu.max once)")
    written: list[Path] = []
    real = cgroups._write

    def recording(path: Path, value: str) -> None:
        written.append(path)
        real(path, value)

    monkeypatch.setattr(cgroups, "_write", recording)
    group = provider.cgroups.create("sb-density-cpu", memory_mb=64, pids=32, cpus=0.5)
    try:
        cpu_writes = [p.name for p in written if p.name.startswith("cpu.cfs_")]
        assert cpu_writes == ["cpu.cfs_quota_us"]
        assert group.cpu is not None
        assert (group.cpu / "cpu.cfs_period_us").read_text().strip() == "100000"
        assert (group.cpu / "cpu.cfs_quota_us").read_text().strip() == "50000"
    finally:
        group.remove()


async def test_an_idle_sandbox_costs_its_provider_one_task(provider: BwrapProvider) -> None:
    """The reader of its socket, and nothing waiting beside it (a watch task per sandbox was ~1.1 KiB of
    the provider's memory each); a sandbox that dies on its own is still noticed and closed."""
    before = len(asyncio.all_tasks())
    sandboxes = [await provider.create(SandboxSpec(ttl_s=60)) for _ in range(10)]
    try:
        assert len(asyncio.all_tasks()) - before == 10
        victim = sandboxes[0]
        victim._group.kill()  # everything in it dies: the provider must see it, diagnose it and close it
        async with asyncio.timeout(10):
            while not victim.closed:
                await asyncio.sleep(0.01)
        with pytest.raises(SandboxClosedError):
            await victim.exec("true")
    finally:
        await asyncio.gather(*(s.close() for s in sandboxes))


T = TypeVar("T")


def _mountinfo(pid: int) -> list[list[str]]:
    with open(f"/proc/{pid}/mountinfo") as f:
        return [line.split() for line in f]


def _shows(pid: int, source: str) -> bool:
    """Whether ``pid`` sees a mount of ``source`` (the field after the fstype, past the optional ones);
    False once it has ended."""
    try:
        return any(line[line.index("-") + 2] == source for line in _mountinfo(pid))
    except (ProcessLookupError, FileNotFoundError):
        return False


def _sandbox_pids(sandbox: BwrapSandbox) -> list[int]:
    """The sandbox's monitor (its host process) and every process in its cgroups."""
    pids = {sandbox.host_pid}
    for procs in sandbox._group.procs_files:
        with contextlib.suppress(OSError):
            pids.update(int(p) for p in Path(procs).read_text().split())
    return sorted(pids)


async def _settled(read: Callable[[], T], done: Callable[[T], bool], timeout_s: float = 5.0) -> T:
    """``read()`` once ``done`` says so of it, or its last value after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    value = read()
    while not done(value) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
        value = read()
    return value


async def _monitor_settled(sandbox: BwrapSandbox) -> list[list[str]]:
    """The monitor's mountinfo once it has let the launcher's mounts go (beside pid 1, not before
    it: maybe after the create returned), or as it is after 5 s."""
    return await _settled(lambda: _mountinfo(sandbox.host_pid), lambda lines: len(lines) <= 2)


def _superblocks(pid: int) -> set[str]:
    """The filesystem instances (major:minor) of the mounts ``pid`` sees."""
    return {line[2] for line in _mountinfo(pid)}


def _mount_point(path: Path) -> str:
    """The host's mount ``path`` is on (the longest mount point above it)."""
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    return max((p for p in points if path == Path(p) or Path(p) in path.parents), key=len)


def _views(pid: int) -> set[str]:
    """The host views (``STAGE/view/<m>``) the overlays ``pid`` sees are stacked on."""
    with open(f"/proc/{pid}/mountinfo") as f:
        return set(re.findall(r"/tmp/sandrl/view/\d+", f.read()))


def _pid1(sandbox: BwrapSandbox) -> int:
    with open(f"/proc/{sandbox.host_pid}/task/{sandbox.host_pid}/children") as f:
        return int(f.read().split()[0])  # the monitor's only child


async def test_a_sandbox_makes_only_the_filesystem_instances_it_needs(either_launch: BwrapProvider) -> None:
    """Every filesystem instance registers a shrinker, and the kernel keeps a slot for each in a map of
    every memory cgroup (~16 bytes): N sandboxes of k instances each cost N x kN slots, 1.4 MiB a
    sandbox at 10,000 live with 9. A sandbox makes its disk's tmpfs (which holds its /dev), its /proc,
    its /dev/pts, an overlay per mount point of its image, and one unprivileged view of each host mount
    its host layers are on (and, unseen here, its ipc namespace's mqueue); the masks of /proc entries
    show one read-only tmpfs of the provider's. Before: a /dev tmpfs, pid 1's staging tmpfs (kept
    alive by the masks) and a view of each host directory (/usr, /etc...), each sandbox's own. The
    views show in no mountinfo (only the monitor's namespace held them, and it keeps no mount now):
    they are counted as the overlays' lower directories."""
    host = _superblocks(os.getpid())
    spec = SandboxSpec(ttl_s=60)
    made = [await either_launch.create(spec) for _ in range(2)]
    try:
        for sb in made:
            await _monitor_settled(sb)
        own = [(_superblocks(_pid1(sb)) | _superblocks(sb.host_pid)) - host for sb in made]
        plan = either_launch.images.get(spec.image).plan
        shared = own[0] & own[1]
        host_mounts = {_mount_point(plan.layers[i]) for i in plan.host_views}
        assert len(own[0] - shared) == 3 + len(plan.overlays), own
        # The views are held only by the overlays stacked on them (the monitor keeps no mount): seen
        # as the overlays' lower directories.
        assert len(_views(_pid1(made[0]))) == len(host_mounts)
        assert len(shared) == 1, shared  # the masks' tmpfs
        masked = await made[0].exec("echo x > /proc/cmdline || echo refused; wc -c < /proc/cmdline")
        assert masked.stdout.split() == ["refused", "0"], masked  # the shared file: read-only, empty
    finally:
        await asyncio.gather(*(sb.close() for sb in made))


async def test_the_monitor_holds_none_of_the_hosts_mounts(either_launch: BwrapProvider) -> None:
    """The helper's process that waits for pid 1 stayed in the mount namespace the root was built in:
    a copy of every host mount (each a ``mnt_cache`` object and its name) and of the sandbox's layer,
    view, overlay and /dev mounts, for as long as the sandbox lived. It keeps only the sandbox's disk
    (the provider reads the overlays' upper directories and the disk's use through it)."""
    host_devs = _superblocks(os.getpid())
    sandbox = await either_launch.create(SandboxSpec(ttl_s=60, disk_mb=64))
    try:
        monitor = await _monitor_settled(sandbox)
        assert len(monitor) <= 2, monitor
        assert not {line[2] for line in monitor} & host_devs, monitor  # none of the host's filesystems
        # What the provider reads through it still resolves: the disk's size, and a file written in
        # the sandbox, in the root overlay's upper directory.
        await sandbox.write_file("/marker", b"here")
        upper = f"/proc/{sandbox.host_pid}/root{UPPER_DIR}"
        assert (Path(upper) / "0" / "marker").read_bytes() == b"here"
        used, size = sandbox.disk_usage()
        assert size == 64 << 20 and used > 0
    finally:
        await sandbox.close()


async def test_a_host_filesystem_unmounted_is_released(either_launch: BwrapProvider, tmp_path: Path) -> None:
    """A filesystem the host mounts before a sandbox is made and unmounts while it lives (a volume
    of a finished job, a disk taken out) is gone from the sandbox's processes once unmounted: a copy
    of its mount in the monitor's namespace kept its superblock alive as long as the sandbox."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    source = f"sandrl-test-{os.getpid()}-{id(tmp_path):x}"
    volume = tmp_path / "volume"
    volume.mkdir()
    await either_launch.premade.close()  # a launch made ahead now would not see the volume
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", source, str(volume)], check=True)
    mounted = True
    sandbox = await either_launch.create(SandboxSpec(ttl_s=60))
    try:
        # The launches made ahead since, waiting in the pool, hold copies of the host's mounts (they
        # read the image's host directories when taken): not this sandbox's.
        await either_launch.premade.close()
        subprocess.run(["umount", str(volume)], check=True)  # not refused: the copies are other mounts
        mounted = False
        # (the monitor lets its mounts go beside pid 1: maybe after the create returned)
        held = await _settled(lambda: [pid for pid in _sandbox_pids(sandbox) if _shows(pid, source)], lambda p: not p)
        assert held == [], "the host's unmounted tmpfs is still mounted in the sandbox's processes"
        assert (await sandbox.exec("true")).exit_code == 0
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(volume)], check=False)
        await sandbox.close()
