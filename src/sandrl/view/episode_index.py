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

import json
import os
import re
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from sandrl.rollout.trajectory import Trajectory

HEAD_END = b',"ids":'
"""Where an episode line's head (its summary fields) ends: the first bulky field."""
HEAD_KEYS = ("episode_id", "group_id", "task_id", "status", "task_set", "timings")
"""A head that lacks one of these was not written summary-first: the line is parsed whole."""
MAX_LINE_BYTES = 256 * 1024 * 1024
"""An episode line longer than this is skipped (listed as unreadable): a line of that size is a
damaged file, and the viewer will not hold it in memory."""
TEXT_BOUND = 300
"""Characters kept of each string the index holds (ids, error messages)."""
_POSITION = re.compile(r"#(\d+)(?:\.r\d+)?$")


@dataclass
class EpisodeIndex:
    """The episodes of one ``rollouts.jsonl``, as columns; :meth:`refresh` reads what was appended."""

    path: Path
    offsets: list[int] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    episode_id: list[str] = field(default_factory=list)
    group_id: list[str] = field(default_factory=list)
    task_id: list[str] = field(default_factory=list)
    task_set: list[str] = field(default_factory=list)
    sample_index: list[int] = field(default_factory=list)
    status: list[str] = field(default_factory=list)
    stop_reason: list[str] = field(default_factory=list)
    reward: list[float | None] = field(default_factory=list)
    passed: list[bool | None] = field(default_factory=list)
    attempt: list[int] = field(default_factory=list)
    weight_version: list[int | None] = field(default_factory=list)
    position: list[int | None] = field(default_factory=list)
    """The group's data position (from ``...#<position>``): which step trained it."""
    error: list[str] = field(default_factory=list)
    """``kind/error_code`` of a failed episode, else empty."""
    timings: list[tuple[float, float, float, float, float]] = field(default_factory=list)
    """Per episode: (setup: create + setup, model, commands: waited on the sandbox, verifier, total) seconds."""
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
        with self.path.open("rb") as file:
            file.seek(self.scanned_bytes)
            for offset, end, line in _lines(file, self.scanned_bytes):
                self.lines += 1
                if line is None:
                    self._unreadable(f"line {self.lines}: over the viewer's bound of {MAX_LINE_BYTES} bytes")
                else:
                    self._add(offset, line)
                self.scanned_bytes = end
        return len(self) - before

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

    def _add(self, offset: int, line: bytes) -> None:
        if not line.strip():
            return
        try:
            data = _summary(line)
            self._append(offset, len(line), data)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            self._unreadable(f"line {self.lines}: not a sandrl trajectory ({type(exc).__name__}: {str(exc)[:120]})")

    def _append(self, offset: int, length: int, data: dict[str, Any]) -> None:
        timings = data.get("timings") or {}
        error = data.get("error") or None
        status = str(data["status"])
        values = (
            _text(data["episode_id"]),
            _text(data["group_id"]),
            _text(data["task_id"]),
            _text(data.get("task_set") or ""),
            int(data.get("sample_index", 0)),
            status,
            _text(data.get("stop_reason") or ""),
            _number(data.get("reward")),
            data.get("passed") if isinstance(data.get("passed"), bool) else None,
            int(data.get("attempt", 1)),
            data.get("weight_version") if isinstance(data.get("weight_version"), int) else None,
            (
                float(timings.get("sandbox_create_s", 0.0)) + float(timings.get("setup_s", 0.0)),
                float(timings.get("model_s", 0.0)),
                float(timings.get("sandbox_wait_s", 0.0)),
                float(timings.get("verifier_s", 0.0)),
                float(timings.get("total_s", 0.0)),
            ),
            _text(f"{error.get('kind', '')}/{error.get('error_code', '')}") if isinstance(error, dict) else "",
        )
        match = _POSITION.search(values[1])
        self.offsets.append(offset)
        self.lengths.append(length)
        (eid, gid, tid, tset, sample, st, stop, reward, passed, attempt, version, times, err) = values
        self.episode_id.append(eid)
        self.group_id.append(gid)
        self.task_id.append(tid)
        self.task_set.append(tset)
        self.sample_index.append(sample)
        self.status.append(st)
        self.stop_reason.append(stop)
        self.reward.append(reward)
        self.passed.append(passed)
        self.attempt.append(attempt)
        self.weight_version.append(version)
        self.timings.append(times)
        self.error.append(err)
        self.position.append(int(match.group(1)) if match else None)

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
        if isinstance(head, dict) and all(key in head for key in HEAD_KEYS):
            return head
    data = json.loads(line)
    if not isinstance(data, dict):
        raise ValueError("the line is not a JSON object")
    return data


def _lines(file: BinaryIO, start: int, chunk: int = 8 * 1024 * 1024) -> Iterator[tuple[int, int, bytes | None]]:
    """``(offset, end, line)`` of each complete line from ``start``: ``end`` is past its newline,
    ``line`` is without it, None for a line over :data:`MAX_LINE_BYTES` (read past, never held)."""
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
            yield pending_at + begin, pending_at + end + 1, data[begin:end] if end - begin <= MAX_LINE_BYTES else None
            begin = end + 1
        pending_at += begin
        pending = data[begin:]
        if len(pending) > MAX_LINE_BYTES:
            skipped = _skip_line(file)
            if skipped is None:  # the writer has not ended the line yet
                return
            yield pending_at, pending_at + len(pending) + skipped, None
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


def _text(value: Any) -> str:
    return str(value)[:TEXT_BOUND]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)
