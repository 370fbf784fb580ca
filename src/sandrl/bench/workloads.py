"""The commands agents really run, by class, and their standalone times.

Three classes, three workloads each, all run inside a sandrl sandbox on inputs that
:mod:`sandrl.bench.workload_inputs` generates there (deterministically, nothing downloaded):

- ``python``: a pytest suite of a small project, a CPU-bound script, an import-heavy start-up;
- ``compile``: gcc and g++ of real translation units at ``-O2``, a ``make -j`` build;
- ``shell``: sort/uniq and grep/sed/awk pipelines over log files, git status/diff/log over a
  repository with history.

A workload's *standalone* time is the median of repeated runs, after a warm-up, on the
otherwise idle host; :mod:`sandrl.bench.contention` divides times under load by it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sandrl.errors import ConfigError, SandrlError
from sandrl.sandbox.base import Sandbox

WorkloadClass = Literal["python", "compile", "shell"]
CLASSES: tuple[WorkloadClass, ...] = ("python", "compile", "shell")
ROOT = "/workspace/bench"
"""Where the inputs live inside a sandbox."""
PY = "/usr/bin/python3"
"""The image's Python (Debian's), not whatever a virtualenv puts first on PATH."""


@dataclass(frozen=True)
class Workload:
    name: str
    cls: WorkloadClass
    command: str
    """A shell command, run from :data:`ROOT`."""
    timeout_s: float = 300.0


WORKLOADS: tuple[Workload, ...] = (
    Workload("pytest_suite", "python", f"cd proj && {PY} -m pytest -q -p no:cacheprovider tests"),
    Workload("cpu_script", "python", f"{PY} cpu.py"),
    Workload(
        "import_heavy",
        "python",
        f"{PY} -c 'import asyncio, email.mime.multipart, http.client, json, decimal, xml.dom.minidom, "
        "unittest.mock, argparse, logging.handlers, sqlite3, csv, pytest, _pytest.python'",
    ),
    Workload("gcc_O2", "compile", "gcc -O2 -c c/big.c -o /tmp/big.o"),
    Workload("gxx_O2", "compile", "g++ -O2 -c cxx/app.cpp -o /tmp/app.o"),
    Workload("make_j", "compile", 'make -s -B -C c -j"$(nproc)"'),
    Workload(
        "sort_uniq",
        "shell",
        "cat text/*.log | awk '{print $2, $3}' | sort | uniq -c | sort -rn | head -20",
    ),
    Workload(
        "grep_sed_awk",
        "shell",
        "grep -h -E 'ERROR|WARN' text/*.log | sed -E 's/user=([a-z]+)/U:\\1/' | "
        "awk '{split($NF, a, \"=\"); s[$3] += a[2]; n[$3]++} END {for (k in s) print k, s[k] / n[k]}' | sort -k2 -n",
    ),
    Workload(
        "git_status_diff",
        "shell",
        "cd repo && git status --porcelain && git diff | wc -l && git diff HEAD~20 --stat && "
        "git log -p | wc -l && git grep -c uncommitted",
    ),
)
BY_NAME = {w.name: w for w in WORKLOADS}
QUICK_NAMES = ("pytest_suite", "cpu_script", "gcc_O2", "make_j", "sort_uniq", "git_status_diff")
"""The ``--quick`` subset: two of each class, the cheaper ones."""


def select(names: Iterable[str] | None = None) -> tuple[Workload, ...]:
    """The named workloads (all when None), in the order given."""
    if names is None:
        return WORKLOADS
    out = []
    for name in names:
        if name not in BY_NAME:
            raise ConfigError(f"no workload named {name!r}; choose from {', '.join(BY_NAME)}")
        out.append(BY_NAME[name])
    if not out:
        raise ConfigError("choose at least one workload")
    return tuple(out)


def generator_source() -> bytes:
    return Path(__file__).with_name("workload_inputs.py").read_bytes()


async def prepare(sandbox: Sandbox) -> None:
    """Generate the inputs into the sandbox (a few seconds; the same bytes every time)."""
    await sandbox.write_file("/tmp/workload_inputs.py", generator_source())
    result = await sandbox.exec(f"{PY} /tmp/workload_inputs.py {ROOT}", timeout_s=300)
    if not result.ok:
        raise SandrlError(
            f"generating the benchmark inputs failed (exit {result.exit_code}): {result.stderr.strip()[-800:]}; "
            "the sandbox image needs python3, gcc, g++, make and git",
            error_code="bench_setup_failed",
        )


async def run(sandbox: Sandbox, workload: Workload) -> float:
    """Run one workload; its duration in seconds as the sandbox measured it."""
    result = await sandbox.exec(workload.command, timeout_s=workload.timeout_s, cwd=ROOT)
    if not result.ok:
        raise SandrlError(
            f"workload {workload.name} failed (exit {result.exit_code}, timed out: {result.timed_out}): "
            f"{result.stderr.strip()[-800:]}",
            error_code="bench_workload_failed",
        )
    return result.duration_s


@dataclass(frozen=True)
class Standalone:
    """A workload's time alone on the idle host."""

    workload: str
    cls: WorkloadClass
    median_s: float
    runs_s: tuple[float, ...]

    def to_dict(self) -> dict[str, object]:
        return {"class": self.cls, "median_s": self.median_s, "runs_s": list(self.runs_s)}


async def measure_standalone(
    sandbox: Sandbox,
    workloads: Sequence[Workload],
    *,
    warmup: int = 1,
    repeats: int = 5,
    tick: Callable[[], None] = lambda: None,
) -> dict[str, Standalone]:
    """Warm up, then time each workload ``repeats`` times in turn (interleaved, so a slow
    moment of the host spreads over all of them); the median of each."""
    if repeats < 1 or warmup < 0:
        raise ConfigError("repeats must be at least 1 and warmup at least 0")
    for _ in range(warmup):
        for w in workloads:
            await run(sandbox, w)
            tick()
    runs: dict[str, list[float]] = {w.name: [] for w in workloads}
    for _ in range(repeats):
        for w in workloads:
            runs[w.name].append(await run(sandbox, w))
            tick()
    return {w.name: Standalone(w.name, w.cls, statistics.median(runs[w.name]), tuple(runs[w.name])) for w in workloads}
