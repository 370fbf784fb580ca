"""The provider's state directory: uid slots, one record per live sandbox, and reaping.

Everything a sandbox leaves on the host outside its own namespaces is listed here, so a
provider that starts can remove what a crashed one left::

    /run/sandrl/slots/<k>.lock    flock'ed by a sandbox's processes for as long as they live
    <state>/sandboxes/<id>/       meta.json (slot, spec, times) and log (the helper's stderr)

A record names the provider process that made the sandbox (pid and start time, :func:`process_identity`)
and, while the sandbox is paused, ``paused``: when, the TTL it had left and the deadline it had. A
paused sandbox's processes are frozen, so they hold their slot lock even when their provider dies
(a running one's pid 1 exits when the provider's end of its socket closes; a frozen one cannot):
:meth:`StateDir.orphaned_paused` finds those, for the reaper to kill. Nobody else could resume
them: only the provider that made a sandbox holds its socket.

Slots are machine-wide (``SANDRL_SLOTS_DIR``, default ``/run/sandrl/slots``) whatever the
state directory, so providers with different state directories never hand out the same uid.

A slot is a host uid range: pid 1 of sandbox k is host uid ``uid_base + k*SLOT_STRIDE`` and its
root the next uid, so no two live sandboxes share a host uid. The lock file's open file
description is inherited by the sandbox's supervisor, so the lock is held exactly as long as the
sandbox lives, whatever happens to the provider; a record whose slot lock is free belongs to a
dead sandbox.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import random
import shutil
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from sandrl.errors import CapacityExhaustedError

UID_RANGE = 65536
"""How many uids the sandbox's own processes use (0..65535 inside)."""
SLOT_STRIDE = 2 * UID_RANGE
"""Host uids one slot owns: pid 1's uid ``base``, then the sandbox's ``base + 1 + n`` for uid n."""
DEFAULT_UID_BASE = 0x70000000
"""Far above the uid ranges distributions hand out (subuid ranges, systemd's dynamic users)."""
STORE_UID_BASE = 0x6FFF0000
"""On-disk owner of the image store's files: uid n of an image is host uid ``STORE_UID_BASE + n``,
never host root, and no slot's range (those start at DEFAULT_UID_BASE)."""
MAX_SLOTS = (0xFFFFFFFF - DEFAULT_UID_BASE) // SLOT_STRIDE
"""The most slots above DEFAULT_UID_BASE whose uid ranges stay below 2**32 - 1 (the invalid uid): 18,431."""
DEFAULT_SLOTS = 16384
"""Slots (live sandboxes) a host may hold, all providers together: 10,000 idle sandboxes with room to spare
(4,096 stopped a host at 4,096 live, well before its memory did)."""
DEFAULT_SLOTS_DIR = Path(os.environ.get("SANDRL_SLOTS_DIR", "/run/sandrl/slots"))


@dataclass
class Slot:
    index: int
    uid: int
    fd: int

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class StateDir:
    def __init__(
        self,
        root: Path,
        *,
        uid_base: int = DEFAULT_UID_BASE,
        slots: int = DEFAULT_SLOTS,
        slots_dir: Path = DEFAULT_SLOTS_DIR,
    ) -> None:
        self.root = root
        self.uid_base = uid_base
        self.n_slots = slots
        self.slots_dir = slots_dir
        self.sandboxes_dir = root / "sandboxes"
        self._freed: deque[int] = deque(maxlen=64)
        """Slots this process's sandboxes held and left, most recent last (:meth:`slot_freed`)."""
        for d in (root, self.slots_dir, self.sandboxes_dir):
            d.mkdir(parents=True, exist_ok=True)
        # Nothing below is for other host users: layers hold what sandboxes wrote (world-writable
        # directories, files of any mode), and the records name live sandboxes.
        os.chmod(root, 0o700)
        os.chmod(self.sandboxes_dir, 0o700)
        # One provider's reaper must never touch another state directory's sandboxes: their
        # cgroups live under a parent named after the state directory.
        self.cgroup_name = "sandrl-" + hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:12]

    def _try_lock(self, index: int) -> int | None:
        fd = os.open(self.slots_dir / f"{index}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    def _take(self, index: int) -> Slot | None:
        fd = self._try_lock(index)
        return None if fd is None else Slot(index=index, uid=self.uid_base + index * SLOT_STRIDE, fd=fd)

    def acquire_slot(self) -> Slot:
        while self._freed:  # a slot left lately first: its lock file is in the page cache
            index = self._freed.pop()
            slot = self._take(index) if index < self.n_slots else None
            if slot is not None:
                return slot
        start = random.randrange(self.n_slots)  # spread providers over the range: fewer collisions
        for i in range(self.n_slots):
            slot = self._take((start + i) % self.n_slots)
            if slot is not None:
                return slot
        raise CapacityExhaustedError(
            f"all {self.n_slots} sandbox uid slots under {self.slots_dir} are in use; close sandboxes first"
        )

    def claim(self, slot: Slot, sandbox_id: str) -> None:
        """Write the owner's id into the slot's lock file, so reaping can tell whose it is."""
        data = sandbox_id.encode()
        os.pwrite(slot.fd, data, 0)
        # Ids have one length, so the file is mostly rewritten in place: truncating it first freed
        # and reallocated its block, a journal transaction (~1 ms on ext4) on every create.
        if os.fstat(slot.fd).st_size != len(data):
            os.ftruncate(slot.fd, len(data))

    def slot_freed(self, index: int) -> None:
        """Slot ``index``'s sandbox is gone: the next :meth:`acquire_slot` tries it first. A slot's
        lock file not touched lately costs the claim's write a read from disk (~0.3 ms of a cold
        create where ``/run`` is not a tmpfs, as in many containers); one just left is cached."""
        self._freed.append(index)

    def slot_owner(self, index: int) -> str | None:
        """The id of the live sandbox holding slot ``index``, or None if the slot is free."""
        fd = self._try_lock(index)
        if fd is not None:
            os.close(fd)
            return None
        try:
            return (self.slots_dir / f"{index}.lock").read_text()
        except OSError:
            return ""

    def record_dir(self, sandbox_id: str) -> Path:
        return self.sandboxes_dir / sandbox_id

    def write_record(self, sandbox_id: str, meta: dict[str, object], *, replace: bool = False) -> Path:
        """Write a new record (``replace``: over the one the sandbox has, see :func:`_write_meta`)."""
        d = self.record_dir(sandbox_id)
        if not replace:
            d.mkdir(mode=0o700)
        _write_meta(d / "meta.json", json.dumps(meta).encode(), create=not replace)
        return d

    def read_record(self, sandbox_id: str) -> dict[str, object] | None:
        try:
            with open(self.record_dir(sandbox_id) / "meta.json", "rb") as f:
                fcntl.flock(f, fcntl.LOCK_SH)  # never half of a rewrite (_write_meta)
                data = json.loads(f.read())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def update_record(self, sandbox_id: str, **fields: object) -> None:
        """Set (or, with None, drop) fields of a sandbox's record; nothing if it has none (gone)."""
        meta = self.read_record(sandbox_id)
        if meta is None:
            return
        for key, value in fields.items():
            if value is None:
                meta.pop(key, None)
            else:
                meta[key] = value
        with contextlib.suppress(OSError):  # the sandbox closed meanwhile: its record is gone
            _write_meta(self.record_dir(sandbox_id) / "meta.json", json.dumps(meta).encode(), create=False)

    def orphaned_paused(self) -> list[str]:
        """Records of paused sandboxes whose provider process is gone (see the module)."""
        orphaned = []
        for sid in self.records():
            meta = self.read_record(sid)
            if meta is None or not meta.get("paused"):
                continue
            owner = meta.get("provider")
            if not isinstance(owner, str) or not process_alive(owner):
                orphaned.append(sid)
        return orphaned

    def remove_record(self, sandbox_id: str) -> None:
        shutil.rmtree(self.record_dir(sandbox_id), ignore_errors=True)

    def records(self) -> list[str]:
        with contextlib.suppress(OSError):
            return sorted(p.name for p in self.sandboxes_dir.iterdir() if p.is_dir())
        return []

    def dead_records(self) -> list[str]:
        """Records of sandboxes whose processes are gone (their slot lock is free)."""
        dead = []
        for sid in self.records():
            meta = self.read_record(sid)
            slot = meta.get("slot") if meta else None
            if not isinstance(slot, int) or self.slot_owner(slot) != sid:
                dead.append(sid)
        return dead

    def slot_base(self, uid: int) -> int:
        """The first host uid of the slot that host uid ``uid`` belongs to."""
        return uid - (uid - self.uid_base) % SLOT_STRIDE

    def sandbox_processes(self, uids: set[int] | None = None) -> list[int]:
        """Host pids of processes running as a sandbox's uids (of the slots of the given uids, or any).

        Zombies are not counted: they run nothing and hold nothing but their pid. A sandbox's
        processes whose parent was killed first are reparented to the host's init, and a container's
        init (this host's is not systemd) may reap them only later."""
        bases = None if uids is None else {self.slot_base(u) for u in uids}
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/status") as f:
                    for line in f:
                        if line.startswith("State:") and line.split()[1] == "Z":
                            break
                        if line.startswith("Uid:"):
                            uid = int(line.split()[2])
                            if uid >= self.uid_base and (bases is None or self.slot_base(uid) in bases):
                                found.append(int(entry))
                            break
            except OSError:
                continue
        return found

    def leaked_processes(self, uids: set[int]) -> list[int]:
        """Processes of these sandboxes' slots that no live sandbox holds: leftovers of a closed
        sandbox (a freed slot may already belong to a new sandbox, whose processes are not)."""
        leaked = []
        for pid in self.sandbox_processes(uids):
            try:
                with open(f"/proc/{pid}/status") as f:
                    uid = next(int(line.split()[1]) for line in f if line.startswith("Uid:"))
            except (OSError, StopIteration):
                continue
            if self.slot_owner((uid - self.uid_base) // SLOT_STRIDE) is None:
                leaked.append(pid)
        return leaked


def process_identity(pid: int | None = None) -> str:
    """``<pid>:<start time>`` of a process (this one by default): unlike a pid alone, never reused."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}:{_start_time(pid)}"


def process_alive(identity: str) -> bool:
    """Whether the process :func:`process_identity` named is still running (not a later one of its pid)."""
    pid, _, start = identity.partition(":")
    if not pid.isdigit():
        return False
    try:
        return str(_start_time(int(pid))) == start
    except OSError:
        return False


def _start_time(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    # Field 22, counted after the command name (which may hold spaces and parentheses).
    return int(stat.rpartition(")")[2].split()[19])


def _write_meta(path: Path, data: bytes, *, create: bool) -> None:
    """Write a record's ``meta.json`` (a new one, or over the one there) under the file's lock, which
    :meth:`StateDir.read_record` takes too, so a reader gets the old record or the new, whole.

    In place, not a new file renamed over it: each sandbox a fork's launch made ahead becomes has its
    record rewritten, and on ext4 a rename over the old file (a new inode, the old one freed) cost
    ~0.4 ms of CPU per sandbox, ~10% of a fork of 16's."""
    flags = os.O_WRONLY | os.O_CLOEXEC | (os.O_CREAT | os.O_EXCL if create else 0)
    fd = os.open(path, flags, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        view = memoryview(data)
        while view:
            view = view[os.pwrite(fd, view, len(data) - len(view)) :]
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)
