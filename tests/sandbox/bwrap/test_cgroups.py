"""cgroup handling for both versions, on fake hierarchies (the real v1 one is used everywhere else)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from sandrl.errors import LimitUnsupportedError
from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.sandbox.bwrap.cgroups import CgroupManager

from ...support import needs_sandbox


def _fake_v2(root: Path, controllers: str = "cpu memory pids") -> Path:
    own = root / "user.slice"
    own.mkdir(parents=True)
    for d in (root, own):
        (d / "cgroup.controllers").write_text(controllers + "\n")
        (d / "cgroup.procs").write_text("")
    return root


def test_v2_is_chosen_and_limits_written(tmp_path: Path) -> None:
    root = _fake_v2(tmp_path / "cg")
    mgr = CgroupManager(root=root, proc_cgroup="0::/user.slice\n", subdir="sandrl/state1")
    assert mgr.version == 2
    assert mgr.missing() == []
    mgr.prepare()
    base = root / "user.slice" / "sandrl" / "state1"
    group = mgr.create("sb-1", memory_mb=64, pids=32, cpus=0.5)
    d = base / "sb-1"
    assert (d / "memory.max").read_text() == str(64 << 20)
    assert (d / "pids.max").read_text() == "32"
    assert (d / "cpu.max").read_text() == "50000 100000"
    assert group.kill_dir == d
    assert (base / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"
    assert (root / "user.slice" / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"
    assert (root / "user.slice" / "sandrl" / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"


def test_v2_without_controllers_reports_them_missing(tmp_path: Path) -> None:
    root = _fake_v2(tmp_path / "cg", controllers="cpu")
    mgr = CgroupManager(root=root, proc_cgroup="0::/user.slice\n")
    assert mgr.missing() == ["memory", "pids"]


def test_v1_uses_own_memory_group(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    for ctrl in ("memory", "pids", "cpu", "cpuacct"):
        (root / ctrl).mkdir(parents=True)
        (root / ctrl / "cgroup.procs").write_text("")
    mgr = CgroupManager(root=root, proc_cgroup="4:memory:/jobs/abc\n8:pids:/\n1:cpu:/\n2:cpuacct:/\n")
    assert mgr.version == 1
    assert mgr.bases["memory"] == root / "memory" / "jobs" / "abc" / "sandrl"
    assert mgr.bases["pids"] == root / "pids" / "sandrl"
    mgr.prepare()
    group = mgr.create("sb-2", memory_mb=128, pids=16, cpus=2)
    assert (mgr.bases["memory"] / "sb-2" / "memory.limit_in_bytes").read_text() == str(128 << 20)
    assert (mgr.bases["cpu"] / "sb-2" / "cpu.cfs_quota_us").read_text() == "200000"
    assert len(group.dirs) == 4


@needs_sandbox
async def test_unenforceable_limit_fails_unless_opted_out(state_dir: Path) -> None:
    provider = BwrapProvider(state_dir)
    # As on a host without the pids controller: the real cgroups, minus that hierarchy.
    del provider.cgroups.bases["pids"]
    provider._cgroup_missing = provider.cgroups.missing()
    assert provider._cgroup_missing == ["pids"]
    with pytest.raises(LimitUnsupportedError, match="pids"):
        await provider.create(SandboxSpec())
    with pytest.warns(UserWarning, match="without pids limits"):
        sb = await provider.create(SandboxSpec(require_limits=False))
    async with sb:
        assert (await sb.exec("echo runs")).stdout == "runs\n"


def test_prepare_removes_other_state_roots_empty_parents_and_create_remakes_its_own(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    for ctrl in ("memory", "pids", "cpu", "cpuacct"):
        (root / ctrl).mkdir(parents=True)
        (root / ctrl / "cgroup.procs").write_text("")
    own_groups = "4:memory:/\n8:pids:/\n1:cpu:/\n2:cpuacct:/\n"
    mine = CgroupManager(root=root, proc_cgroup=own_groups, subdir="sandrl/sandrl-aaaaaaaaaaaa")
    other = CgroupManager(root=root, proc_cgroup=own_groups, subdir="sandrl/sandrl-bbbbbbbbbbbb")
    busy = CgroupManager(root=root, proc_cgroup=own_groups, subdir="sandrl/sandrl-cccccccccccc")
    young = CgroupManager(root=root, proc_cgroup=own_groups, subdir="sandrl/sandrl-dddddddddddd")
    for mgr in (other, busy, young):
        mgr.prepare()
    for ctrl in ("memory", "pids", "cpu", "cpuacct"):  # made a while ago; young's was made just now
        for name in ("sandrl-bbbbbbbbbbbb", "sandrl-cccccccccccc"):
            os.utime(root / ctrl / "sandrl" / name, (time.time() - 3600, time.time() - 3600))
    # Here a parent holding a sandbox's group is a non-empty dir, which rmdir refuses as the kernel
    # does; a name that is not a state directory's is never touched.
    busy.create("sb-live", memory_mb=None, pids=None, cpus=None)
    (root / "pids" / "sandrl" / "not-a-state-root").mkdir()
    mine.prepare()
    kept = ["sandrl-aaaaaaaaaaaa", "sandrl-cccccccccccc", "sandrl-dddddddddddd"]  # mine, busy, young
    for ctrl in ("memory", "pids", "cpu", "cpuacct"):
        names = sorted(p.name for p in (root / ctrl / "sandrl").iterdir())
        assert names == (["not-a-state-root"] if ctrl == "pids" else []) + kept
    # The other provider's parent is gone; its next sandbox makes it again.
    group = other.create("sb-next", memory_mb=64, pids=None, cpus=None)
    assert (root / "memory" / "sandrl" / "sandrl-bbbbbbbbbbbb" / "sb-next" / "memory.limit_in_bytes").is_file()
    assert len(group.dirs) == 4
