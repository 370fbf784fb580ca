"""An index of a run's ``rollouts.jsonl``: where each episode's line is and what it says in brief.

A run of 100k episodes writes a file of several hundred MB; the viewer must open it in under two
seconds and keep up while the run appends to it. The index reads each line once, and of the line
only its head: :meth:`Trajectory.to_dict` writes the small fields first and the bulky ones
(``ids`` first) last, so the text before the first ``,"ids":`` parses alone. A line written in
another order (an older sandrl, or another writer) is parsed whole: slower, never wrong.

The index holds columns (lists), not trajectories; :meth:`EpisodeIndex.read` reads one episode's
line again when the page asks for it. Everything in an episode came from a model or a sandbox:
strings are cut to a bound and the file is read in bounded chunks.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
from array import array
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from sys import intern
from typing import Any, BinaryIO, TypeGuard

import orjson

from sandrl.rollout.trajectory import STATUSES, Trajectory

HEAD_END = b',"ids":'
"""Where an episode line's head (its summary fields) ends: the first bulky field."""
HEAD_KEYS = ("episode_id", "group_id", "task_id", "status", "task_set", "timings")
"""A head that lacks one of these was not written summary-first: the line is parsed whole."""
MAX_LINE_BYTES = 256 * 1024 * 1024
"""An episode line longer than this is skipped (listed as unreadable): a line of that size is a
damaged file, and the viewer will not hold it in memory."""
PHASES = ("setup_s", "model_s", "commands_s", "verifier_s", "total_s")
"""The phases of an episode's time the index keeps: setup is the sandbox's creation and the task's
setup, commands the time the agent waited on the sandbox."""
BATCH = 4096
"""Lines whose heads are parsed in one call."""
HEAD_READ = 64 * 1024
"""Bytes read of a line for its head (a head is a few hundred bytes; an old line is read whole)."""
TEXT_BOUND = 300
"""Characters kept of each string the index holds (ids, error messages)."""


@dataclass
class EpisodeIndex:
    """The episodes of one ``rollouts.jsonl``, as columns; :meth:`refresh` reads what was appended."""

    path: Path
    offsets: list[int] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    group_id: list[str] = field(default_factory=list)
    task_id: list[str] = field(default_factory=list)
    task_set: list[str] = field(default_factory=list)
    status: list[str] = field(default_factory=list)
    reward: list[float | None] = field(default_factory=list)
    passed: list[bool | None] = field(default_factory=list)
    attempt: list[int] = field(default_factory=list)
    position: list[int | None] = field(default_factory=list)
    """The group's data position (from ``...#<position>``): which step trained it."""
    phases: tuple[array[float], ...] = field(default_factory=lambda: tuple(array("d") for _ in PHASES))
    """Per phase of :data:`PHASES`, per episode, its seconds (arrays: 100k episodes hold no float objects)."""
    unreadable: list[str] = field(default_factory=list)
    """``line N: why`` for each line that is not an episode (bounded to 100)."""
    unreadable_count: int = 0
    scanned_bytes: int = 0
    lines: int = 0

    def __len__(self) -> int:
        return len(self.offsets)

    def refresh(self) -> int:
        """Index the lines appended since the last call; return how many episodes were added.

        A line not yet ended by a newline (the writer is mid-line) is left for the next call."""
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return 0
        if size < self.scanned_bytes:  # the file was replaced (a new run in the same place): start over
            self.__init__(self.path)  # type: ignore[misc]
        before = len(self)
        batch: list[tuple[int, int, int, bytes]] = []
        # Reading 100k episodes makes millions of objects that live on: the cyclic collector would
        # rescan them again and again; none of them can form a cycle.
        with _no_gc(), self.path.open("rb") as file:
            file.seek(self.scanned_bytes)
            for offset, end, piece, is_head in _lines(file, self.scanned_bytes):
                self.lines += 1
                if piece is None:
                    self._unreadable(f"line {self.lines}: over the viewer's bound of {MAX_LINE_BYTES} bytes")
                elif is_head:
                    batch.append((self.lines, offset, end - offset - 1, piece))
                elif piece.strip():
                    self._add_whole(self.lines, offset, piece)
                if len(batch) >= BATCH:
                    self._add(batch)
                    batch = []
                self.scanned_bytes = end
            self._add(batch)
        return len(self) - before

    def head(self, number: int) -> dict[str, Any]:
        """What episode ``number``'s line says besides its bulk (ids, turns, verifier), strings bounded:
        for the rows of the episode list, which the index does not hold."""
        with self.path.open("rb") as file:
            file.seek(self.offsets[number])
            start = file.read(min(self.lengths[number], HEAD_READ))
            cut = start.find(HEAD_END)
            line = start if cut > 0 else start + file.read(self.lengths[number] - len(start))
        data = _summary(line if cut <= 0 else line[:cut] + b',"ids":[]}')
        error = data.get("error")
        return {
            "episode_id": _text(data.get("episode_id", "")),
            "sample_index": _whole(data.get("sample_index"), 0),
            "stop_reason": _text(data.get("stop_reason") or ""),
            "weight_version": _whole(data.get("weight_version"), None),
            "error": _text(f"{error.get('kind', '')}/{error.get('error_code', '')}") if isinstance(error, dict) else "",
        }

    def read(self, number: int) -> Trajectory:
        """Episode ``number`` (0-based, in the file's order), read again from its line."""
        with self.path.open("rb") as file:
            file.seek(self.offsets[number])
            line = file.read(self.lengths[number])
        return Trajectory.from_dict(json.loads(line))

    def steps(self, data_positions: Sequence[int]) -> list[int | None]:
        """Per episode, the step that trained its group: the first whose ``data_position`` (the first
        position not yet trained) is past the group's; None for a group no step has reached (or an eval's)."""
        out: list[int | None] = []
        for position in self.position:
            if position is None or not data_positions:
                out.append(None)
                continue
            step = bisect_right(data_positions, position) + 1
            out.append(step if step <= len(data_positions) else None)
        return out

    def _add(self, batch: list[tuple[int, int, int, bytes]]) -> None:
        """Index a batch of line heads ``(number, offset, length, head)``, parsed as one JSON array
        (one parser call for thousands of lines); a head that does not parse alone, its line whole."""
        if not batch:
            return
        parsed: list[Any] | None = None
        try:
            # orjson: a third of json's time on these heads; it refuses NaN, which json's writer
            # puts where a number is not finite: such a batch is read line by line.
            parsed = orjson.loads(b"[" + b"},".join(head for _, _, _, head in batch) + b"}]")
        except ValueError:
            parsed = None
        rows: list[tuple[int, int, dict[str, Any]]] = []
        for k, (number, offset, length, _) in enumerate(batch):
            data = parsed[k] if parsed is not None else None
            if _usable(data) and _complete(data):
                rows.append((offset, length, data))
            else:
                self._append(rows)
                rows = []
                self._add_whole(number, offset, self._line(offset, length))
        self._append(rows)

    def _add_whole(self, number: int, offset: int, line: bytes) -> None:
        try:
            data = _summary(line)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            data, why = None, f"{type(exc).__name__}: {str(exc)[:120]}"
        else:
            why = "its fields are not a trajectory's"
        if not _usable(data):
            self._unreadable(f"line {number}: not a sandrl trajectory ({why})")
            return
        self._append([(offset, len(line), data)])

    def _line(self, offset: int, length: int) -> bytes:
        with self.path.open("rb") as file:
            file.seek(offset)
            return file.read(length)

    def _append(self, rows: list[tuple[int, int, dict[str, Any]]]) -> None:
        # The hot loop of opening a large run: column by column over rows _usable said are episodes;
        # the strings that repeat over episodes (task, source, status) are interned.
        datas = [data for _, _, data in rows]
        self.offsets.extend(offset for offset, _, _ in rows)
        self.lengths.extend(length for _, length, _ in rows)
        self.group_id.extend(_text(d["group_id"]) for d in datas)
        self.task_id.extend(intern(_text(d["task_id"])) for d in datas)
        self.task_set.extend(intern(_text(d.get("task_set") or "")) for d in datas)
        self.status.extend(intern(d["status"]) for d in datas)
        self.reward.extend(_number(d.get("reward")) for d in datas)
        self.passed.extend(p if isinstance(p := d.get("passed"), bool) else None for d in datas)
        self.attempt.extend(_whole(d.get("attempt"), 1) or 1 for d in datas)
        times = [_times(d.get("timings")) for d in datas]
        for k, column in enumerate(self.phases):
            column.extend(t[k] for t in times)
        self.position.extend(_position(d["group_id"]) for d in datas)

    def _unreadable(self, why: str) -> None:
        self.unreadable_count += 1
        if len(self.unreadable) < 100:
            self.unreadable.append(why)


def _summary(line: bytes) -> dict[str, Any]:
    """The fields of an episode line that the index keeps: from its head alone when it was written
    summary-first, else from the whole line."""
    cut = line.find(HEAD_END)
    if cut > 0:
        try:
            head = json.loads(line[:cut] + b"}")
        except ValueError:
            head = None
        if isinstance(head, dict) and _complete(head):
            return head
    data = json.loads(line)
    if not isinstance(data, dict):
        raise ValueError("the line is not a JSON object")
    return data


def _lines(file: BinaryIO, start: int, chunk: int = 8 * 1024 * 1024) -> Iterator[tuple[int, int, bytes | None, bool]]:
    """``(offset, end, piece, is_head)`` of each complete line from ``start``: ``end`` is past its
    newline; ``piece`` is the line's head where it has one (``is_head``), else the line without its
    newline, None for a line over :data:`MAX_LINE_BYTES` (read past, never held). A line's bulk is
    never copied."""
    pending = b""
    pending_at = start
    while True:
        block = file.read(chunk)
        if not block:
            return
        data = pending + block if pending else block
        begin = 0
        while True:
            end = data.find(b"\n", begin)
            if end < 0:
                break
            cut = data.find(HEAD_END, begin, end)
            if cut > begin:
                yield pending_at + begin, pending_at + end + 1, data[begin:cut], True
            else:
                yield (
                    pending_at + begin,
                    pending_at + end + 1,
                    data[begin:end] if end - begin <= MAX_LINE_BYTES else None,
                    False,
                )
            begin = end + 1
        pending_at += begin
        pending = data[begin:]
        if len(pending) > MAX_LINE_BYTES:
            skipped = _skip_line(file)
            if skipped is None:  # the writer has not ended the line yet
                return
            yield pending_at, pending_at + len(pending) + skipped, None, False
            pending_at += len(pending) + skipped
            pending = b""


def _skip_line(file: BinaryIO, chunk: int = 8 * 1024 * 1024) -> int | None:
    """Read past the rest of the current line and its newline; return the bytes that took (None: no newline yet)."""
    skipped = 0
    while True:
        block = file.read(chunk)
        if not block:
            return None
        end = block.find(b"\n")
        if end >= 0:
            file.seek(-(len(block) - end - 1), os.SEEK_CUR)
            return skipped + end + 1
        skipped += len(block)


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _complete(data: dict[str, Any]) -> bool:
    return all(key in data for key in HEAD_KEYS)


def _usable(data: Any) -> TypeGuard[dict[str, Any]]:
    """``data`` is an episode's summary: the fields the index reads, of their types."""
    try:
        return (
            isinstance(data, dict)
            and type(data["group_id"]) is str
            and type(data["task_id"]) is str
            and data["status"] in STATUSES
        )
    except (KeyError, TypeError, IndexError):
        return False


def _whole(value: Any, default: int | None) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _times(times: Any) -> tuple[float, float, float, float, float]:
    try:  # the common case, fast; anything odd (a field missing, a string) on the checked path below
        return (
            float(times["sandbox_create_s"]) + float(times["setup_s"]),
            float(times["model_s"]),
            float(times["sandbox_wait_s"]),
            float(times["verifier_s"]),
            float(times["total_s"]),
        )
    except (TypeError, ValueError, KeyError, OverflowError):
        pass
    if not isinstance(times, dict):
        return (0.0, 0.0, 0.0, 0.0, 0.0)
    return (
        _seconds(times.get("sandbox_create_s")) + _seconds(times.get("setup_s")),
        _seconds(times.get("model_s")),
        _seconds(times.get("sandbox_wait_s")),
        _seconds(times.get("verifier_s")),
        _seconds(times.get("total_s")),
    )


def _seconds(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _position(group_id: str) -> int | None:
    """The data position of a group id ``<run>/<task>#<position>[.r<N>]``."""
    _, hash_sign, tail = group_id.rpartition("#")
    position = tail.split(".", 1)[0]
    return int(position) if hash_sign and position.isdigit() and len(position) < 19 else None


def _text(value: Any) -> str:
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= TEXT_BOUND else text[:TEXT_BOUND]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)
