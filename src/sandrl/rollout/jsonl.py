"""Trajectories on disk: one JSON object per line, written as episodes finish, read back exactly.

Floats are written with Python's shortest round-tripping repr, so ``read_jsonl(write_jsonl(t))``
gives trajectories equal field for field (log-probs bit for bit): ``--save-rollouts`` then
``--load-rollouts`` trains on exactly what was generated.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import IO

from sandrl.errors import ConfigError
from sandrl.rollout.trajectory import Trajectory


def dumps(trajectory: Trajectory) -> str:
    """One line, without the newline."""
    return json.dumps(trajectory.to_dict(), ensure_ascii=False, separators=(",", ":"), allow_nan=True)


def loads(line: str) -> Trajectory:
    return Trajectory.from_dict(json.loads(line))


class TrajectoryWriter:
    """Appends trajectories to a JSONL file, one flushed line each (a crash loses at most the line being written)."""

    def __init__(self, path: str | os.PathLike[str], *, append: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] = self.path.open("a" if append else "w", encoding="utf-8")
        self.count = 0

    def write(self, trajectory: Trajectory) -> None:
        self._file.write(dumps(trajectory) + "\n")
        self._file.flush()
        self.count += 1

    def write_all(self, trajectories: Iterable[Trajectory]) -> None:
        for trajectory in trajectories:
            self.write(trajectory)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> TrajectoryWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def write_jsonl(path: str | os.PathLike[str], trajectories: Iterable[Trajectory]) -> int:
    """Write ``trajectories`` to ``path`` (replacing it); return how many."""
    with TrajectoryWriter(path) as writer:
        writer.write_all(trajectories)
        return writer.count


def iter_jsonl(path: str | os.PathLike[str]) -> Iterator[Trajectory]:
    """The trajectories of a JSONL file, in order; a malformed line is a ConfigError naming it."""
    with Path(path).open(encoding="utf-8") as file:
        for number, line in enumerate(file, 1):
            if not line.strip():
                continue
            try:
                yield loads(line)
            except (ValueError, TypeError, KeyError) as exc:
                raise ConfigError(
                    f"{path}:{number}: not a sandrl trajectory ({exc}); was it written by --save-rollouts?"
                ) from exc


def read_jsonl(path: str | os.PathLike[str]) -> list[Trajectory]:
    return list(iter_jsonl(path))
