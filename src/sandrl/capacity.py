"""A host's capacity in commands at once, as a run is given it: a number, or a benchmark's result.

``sandrl bench contention`` measures a host's capacity in *background* tasks with its probe on
top, so the host runs ``capacity + 1`` busy sandboxes within the
latency bar: the commands a runner admits at once (``RunnerConfig.host_capacity``), a training
run's ``capacity_file`` and a fleet host's. It sits below ``bench/`` so that the runtime can
read a result without importing the benchmarks.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sandrl.errors import ConfigError
from sandrl.result_file import load_result


def admission_slots(result: Mapping[str, Any]) -> int:
    """Commands a host runs at once within the bar, from a ``sandrl bench contention`` result.

    Capacity counts background tasks with the probe on top, so the busy sandboxes at capacity
    are ``capacity + 1``: the host capacity to admit (``RunnerConfig.host_capacity``).
    """
    cap = result.get("capacity") or {}
    load = cap.get("load")
    if load is None:
        raise ConfigError(
            "that contention result has no capacity (even the idle host failed the bar): rerun it on a quieter "
            "host or with a looser --bar, or give the capacity as a number"
        )
    return int(load) + 1


def slots_from_file(path: str | Path) -> int:
    """:func:`admission_slots` of the ``sandrl bench contention`` result at ``path``, checked."""
    result = load_result(path)
    if result["bench"] != "contention":
        raise ConfigError(f"{path} is a `sandrl bench {result['bench']}` result; the capacity is in a contention one")
    try:
        return admission_slots(result)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc.message}") from exc


def parse_capacity(text: str | None, option: str = "--capacity") -> tuple[int | None, str]:
    """A host capacity as given on a command line: a whole number of commands at once, or a
    ``sandrl bench contention`` result file. Returns (slots, where they came from); None: not given."""
    if text is None:
        return None, "measured"
    try:
        slots = int(text)
    except ValueError:
        if not Path(text).exists():
            raise ConfigError(
                f"{option} takes a whole number or a contention result file; {text!r} is neither"
            ) from None
        return slots_from_file(text), text
    if slots < 1:
        raise ConfigError(f"{option} must be at least 1 command at once, got {slots}")
    return slots, "given"
