"""What a state directory holds on this host, sandbox by sandbox; removing what nobody owns any more.

Several runs may share one state directory (``$SANDRL_STATE_DIR``) and one host. Each sandbox is
known by its record (:mod:`.state`: its slot, spec and the process that made it, its *owner*) and
its cgroups (:mod:`.cgroups`, found under every group of the host, not only this process's), and
is in one of these states:

========  =====================================================================================
live      its processes hold its slot and its owner runs
paused    the same, frozen by its owner (:meth:`~.sandbox.BwrapSandbox.pause`)
premade   a launch its owner made ahead for a fork's child (:mod:`.premade`), not yet taken
orphaned  its processes live on without their owner (frozen, a paused sandbox cannot see it go):
          nobody can use it any more
dead      its processes are gone: its record and cgroups are all that is left
stray     cgroups with no record (a removal that could not finish); processes in them are killed
========  =====================================================================================

:func:`garbage` is what ``sandrl sandbox gc`` removes: the dead ones whose owner is gone too (a
live owner removes its own when it sees them end) and stray cgroups; with ``orphans``, the
orphaned ones as well. A sandbox whose owner runs is never touched, whoever the owner is.
``sandrl sandbox ls|gc`` read the store without a provider, whose start reaps at once
(:meth:`~.provider.BwrapProvider.reap`): ``ls`` shows what is there, ``gc`` asks first.

:func:`traces` is a run's own leak check: what the sandboxes *it* closed still have on the host,
never another run's sandboxes that share the state directory.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from sandrl.sandbox.bwrap.cgroups import CgroupManager, remove_group_dir
from sandrl.sandbox.bwrap.state import StateDir, process_alive

SandboxState = Literal["live", "paused", "premade", "orphaned", "dead", "stray"]
STATES: tuple[SandboxState, ...] = get_args(SandboxState)
"""Every state, in the order a listing counts them."""
UNREADABLE_RECORD_AGE_S = 10.0
"""A record without a readable ``meta.json`` counts as dead once it is this old (younger, it may be
one being written)."""
MAX_COMMAND_CHARS = 120


@dataclass(frozen=True)
class StoredSandbox:
    """One sandbox of a state directory as this host has it now."""

    id: str
    state: SandboxState
    owner_pid: int | None
    """The process that made it (None: no record says)."""
    owner_alive: bool
    owner_command: str | None
    """The owner's command line while it runs, bounded and printable."""
    image: str | None
    created: float | None
    paused: bool
    premade: bool
    record: bool
    """Whether it has a record (a stray group has none)."""
    cgroups: tuple[Path, ...]

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "state": self.state,
            "owner_pid": self.owner_pid,
            "owner_alive": self.owner_alive,
            "owner_command": self.owner_command,
            "image": self.image,
            "created": self.created,
            "paused": self.paused,
            "premade": self.premade,
            "record": self.record,
            "cgroups": len(self.cgroups),
        }


def survey(state: StateDir, cgroups: CgroupManager) -> list[StoredSandbox]:
    """Every sandbox of ``state`` on this host: records first by id, then stray groups."""
    # Groups first: a sandbox's record is written before its groups are made, so a group found
    # here whose record is missing below is no create under way.
    groups = cgroups.groups_anywhere()
    found: list[StoredSandbox] = []
    recorded: set[str] = set()
    for sid in state.records():
        entry = _from_record(state, sid, tuple(groups.get(sid, ())))
        if entry is not None:
            found.append(entry)
            recorded.add(sid)
    for name in sorted(set(groups) - recorded):
        if not state.record_dir(name).exists():  # its record may have been made since
            found.append(_stray(name, tuple(groups[name])))
    return found


def _from_record(state: StateDir, sid: str, groups: tuple[Path, ...]) -> StoredSandbox | None:
    meta = state.read_record(sid)
    if meta is None:
        try:
            age = time.time() - state.record_dir(sid).stat().st_mtime
        except OSError:
            return None  # removed meanwhile
        if age < UNREADABLE_RECORD_AGE_S:
            return None
        meta = {}
    owner = meta.get("provider")
    owner_alive = isinstance(owner, str) and process_alive(owner)
    pid_text = owner.partition(":")[0] if isinstance(owner, str) else ""
    owner_pid = int(pid_text) if pid_text.isdigit() else None
    slot = meta.get("slot")
    alive = isinstance(slot, int) and state.slot_owner(slot) == sid
    paused = bool(meta.get("paused"))
    premade = bool(meta.get("premade"))
    spec = meta.get("spec")
    image = spec.get("image") if isinstance(spec, dict) else None
    created = meta.get("created")
    status: SandboxState
    if not alive:
        status = "dead"
    elif not owner_alive:
        status = "orphaned"
    else:
        status = "premade" if premade else "paused" if paused else "live"
    return StoredSandbox(
        id=sid,
        state=status,
        owner_pid=owner_pid,
        owner_alive=owner_alive,
        owner_command=_command(owner_pid) if owner_alive and owner_pid is not None else None,
        image=image if isinstance(image, str) else None,
        created=float(created) if isinstance(created, int | float) else None,
        paused=paused,
        premade=premade,
        record=True,
        cgroups=groups,
    )


def _stray(name: str, groups: tuple[Path, ...]) -> StoredSandbox:
    return StoredSandbox(
        id=name,
        state="stray",
        owner_pid=None,
        owner_alive=False,
        owner_command=None,
        image=None,
        created=None,
        paused=False,
        premade=False,
        record=False,
        cgroups=groups,
    )


def _command(pid: int) -> str | None:
    """``pid``'s command line as one printable, bounded line."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read(4 * MAX_COMMAND_CHARS)
    except OSError:
        return None
    text = raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
    text = "".join(c if c.isprintable() else " " if c.isspace() else "?" for c in text)
    return text if len(text) <= MAX_COMMAND_CHARS else text[: MAX_COMMAND_CHARS - 3] + "..."


def garbage(entries: Iterable[StoredSandbox], *, orphans: bool = False) -> list[StoredSandbox]:
    """What ``gc`` removes of ``entries`` (see the module): never a sandbox whose owner runs."""
    return [
        e
        for e in entries
        if e.state == "stray" or (e.state == "dead" and not e.owner_alive) or (orphans and e.state == "orphaned")
    ]


def collect(state: StateDir, cgroups: CgroupManager, ids: Sequence[str], *, orphans: bool = False) -> list[str]:
    """Remove the sandboxes ``ids`` that are still garbage now (a survey made before a question
    may be old): kill what is in their groups, remove the groups, then the record. Their ids."""
    now = {e.id: e for e in garbage(survey(state, cgroups), orphans=orphans)}
    removed = []
    for sid in ids:
        entry = now.get(sid)
        if entry is None:
            continue
        for d in entry.cgroups:
            remove_group_dir(d)
        if entry.record:
            state.remove_record(sid)
        removed.append(sid)
    return removed


@dataclass(frozen=True)
class Traces:
    """What some closed sandboxes still have on the host."""

    records: tuple[str, ...]
    cgroups: tuple[str, ...]
    processes: tuple[int, ...]

    def __bool__(self) -> bool:
        return bool(self.records or self.cgroups or self.processes)

    def describe(self) -> str:
        if not self:
            return "nothing"
        parts = [f"the record of {sid}" for sid in self.records]
        parts += [f"the cgroups of {sid}" for sid in self.cgroups]
        if self.processes:
            parts.append(f"{len(self.processes)} process(es): {' '.join(map(str, self.processes))}")
        return "; ".join(parts)


def traces(state: StateDir, cgroups: CgroupManager, sandboxes: Iterable[tuple[str, int]]) -> Traces:
    """What the sandboxes ``(id, uid)`` (the ones a run made and closed) left: records, cgroups (of
    this process's view: its provider made them there) and processes. Only those are looked at:
    another run's sandboxes in the same state directory are no leak of this one."""
    given = list(sandboxes)
    ids = {sid for sid, _ in given}
    groups = cgroups.stale_groups()
    return Traces(
        records=tuple(sorted(sid for sid in ids if state.record_dir(sid).exists())),
        cgroups=tuple(sorted(ids & set(groups))),
        processes=tuple(sorted(state.leaked_processes({uid for _, uid in given}))) if given else (),
    )
