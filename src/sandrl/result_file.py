"""A benchmark's result file: the JSON line a ``sandrl bench`` command prints, read and checked.

It sits below ``bench/`` because the runtime reads one too: a host's capacity is given as a
``sandrl bench contention`` result (:func:`sandrl.capacity.slots_from_file`), and the
benchmarks' report reads all three kinds the same way. A contention result (``bench:
contention``) holds ``host``, ``config``, ``standalone``, ``levels``, ``capacity`` and
``full_load`` (since version 2 also ``baseline`` and ``host_noise``; ``sandrl bench study``
puts its host's episode run in the same file's ``episodes`` and ``projection``); an episode
result (``bench: episodes``) holds ``host``, ``config``, ``episodes`` and ``projection``; an
admission result (``bench: admission``) holds its two ways side by side.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sandrl.errors import ConfigError

REQUIRED = {
    "contention": ("host", "config", "standalone", "levels", "capacity", "full_load"),
    "episodes": ("host", "config", "episodes", "projection"),
    "admission": ("host", "config", "capacity", "offered", "admit_all", "capacity_aware", "ratios", "claims"),
}
"""The keys each kind of result must have."""


def load_result(path: Path | str) -> dict[str, Any]:
    """Read and check one result file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read the result {path}: {exc.strerror}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        # A saved stdout holds the table too: the result is its last line, the JSON one.
        lines = [ln for ln in text.splitlines() if ln.startswith("{")]
        try:
            data = json.loads(lines[-1])
        except (json.JSONDecodeError, IndexError) as exc:
            raise ConfigError(f"{path} is not a benchmark result (no JSON object in it)") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path} is not a benchmark result (its JSON is not an object)")
    result: dict[str, Any] = data
    kind = result.get("bench")
    if kind not in REQUIRED:
        raise ConfigError(
            f"{path} is not a `sandrl bench contention` result, nor an `episodes` or `admission` one "
            f"(its 'bench' is {kind!r})"
        )
    missing = [k for k in REQUIRED[kind] if k not in result]
    if missing:
        raise ConfigError(f"{path} lacks {', '.join(missing)}: was it written by an older sandrl?")
    return result
