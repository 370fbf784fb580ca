"""``sandrl bench study``: the whole sandbox-CPU study in one command, on this host and a smaller one.

For each of two hosts, this one (A) and an emulated second one (B: ``--cpus-per-host`` cores
of this one, pinned or by quota, :mod:`sandrl.bench.hostlimit`), it runs

1. the contention sweep (:mod:`sandrl.bench.contention`): capacity within the latency bar with
   its interval, per-core slowdown at full load, the standalone baselines and the noise
   diagnosis;
2. the episode run (:mod:`sandrl.bench.episodes`): built-in tasks replayed with the emulated
   model time, where an episode's time goes, the idle KV cache and the projection for faster
   inference;

and writes, in ``--out-dir``: one result per host (the contention result with the episode
run's ``episodes`` and ``projection`` in it, so ``sandrl bench compare`` and ``report`` read
both halves from one file), the side-by-side comparison (``compare.json``), the HTML report
(``report.html``, with the seed's published figures beside this run's) and ``study.json``
(what ran, how long each part took). Its sizes are chosen to finish within 15 minutes on a
2-core host (:data:`BUDGET_S`); the result says how long it took.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rich.console import Console

from sandrl.bench import contention, episodes, report
from sandrl.bench.contention import ContentionConfig
from sandrl.bench.episodes import EpisodesConfig
from sandrl.errors import ConfigError

RESULT_VERSION = 1
BUDGET_S = 15 * 60
"""What the default study is sized for on a 2-core host (the quick one: about 5 minutes)."""
HOSTS = ("hostA", "hostB")


def contention_config(quick: bool, cores: float | None, host_limit: str, seed: int) -> ContentionConfig:
    """The study's sweep: ``--quick``'s, or every workload with the grid only one level past the
    first failing one (the rest of the curve cannot change the capacity and would cost the
    budget: 4C background tasks of 9 workloads take minutes a level)."""
    if quick:
        return ContentionConfig(quick=True, cores=cores, host_limit=host_limit, seed=seed)  # type: ignore[arg-type]
    return ContentionConfig(
        cores=cores,
        host_limit=host_limit,  # type: ignore[arg-type]
        repeats=2,
        settle_s=2.0,
        past_failure=1,
        seed=seed,
    )


def episodes_config(quick: bool, cores: float | None, host_limit: str, seed: int) -> EpisodesConfig:
    """The study's episode run: ``--quick``'s, or 16 episodes (each default task twice) of 5
    turns with 2 s of emulated model time each, the host kept busy by one background task a core."""
    return EpisodesConfig(
        quick=quick,
        episodes=None if quick else 16,
        cores=cores,
        host_limit=host_limit,  # type: ignore[arg-type]
        seed=seed,
    )


def second_host_cores(cores: int) -> float:
    """Host B's default size: half of this host's cores, at least one."""
    return float(max(1, cores // 2))


@dataclass(frozen=True)
class StudyConfig:
    quick: bool = False
    cpus_per_host: float | None = None
    """Host B's cores; default half of this host's (at least 1)."""
    host_limit: Literal["auto", "affinity", "quota"] = "auto"
    out_dir: Path = Path("study")
    seed: int = 0

    def host_b(self, usable: int) -> float:
        cores = self.cpus_per_host if self.cpus_per_host is not None else second_host_cores(usable)
        if not (math.isfinite(cores) and 0 < cores <= usable):
            raise ConfigError(f"--cpus-per-host must be more than 0 and at most {usable} (this host's CPUs)")
        return cores


Runner = Callable[..., Awaitable[dict[str, Any]]]


def merge(sweep: dict[str, Any], episode_run: dict[str, Any]) -> dict[str, Any]:
    """One host's result: the sweep's, with the episode run's breakdown and projection in it."""
    merged = dict(sweep)
    merged["episodes"] = episode_run["episodes"]
    merged["projection"] = episode_run["projection"]
    merged["episode_run"] = {k: episode_run.get(k) for k in ("config", "background", "host", "duration_s")}
    return merged


async def run(
    config: StudyConfig,
    *,
    console: Console | None = None,
    usable_cpus: int | None = None,
    run_contention: Runner = contention.run,
    run_episodes: Runner = episodes.run,
) -> dict[str, Any]:
    """Run the study; write its files; return ``study.json``'s content."""
    import os

    console = console or Console(stderr=True)
    usable = usable_cpus if usable_cpus is not None else len(os.sched_getaffinity(0))
    hosts: dict[str, float | None] = {"hostA": None, "hostB": config.host_b(usable)}
    if hosts["hostB"] == float(usable):
        console.print(f"[yellow]host B has all {usable} cores: the two hosts are the same[/yellow]")
    out = config.out_dir
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    parts: list[dict[str, Any]] = []
    files: dict[str, str] = {}
    configs: dict[str, dict[str, Any]] = {}
    for name, cores in hosts.items():
        label = f"{name} ({'all cores' if cores is None else f'{cores:g} cores'})"
        console.rule(f"{label}: contention")
        t0 = time.monotonic()
        sweep = await run_contention(
            contention_config(config.quick, cores, config.host_limit, config.seed), console=console
        )
        parts.append({"host": name, "part": "contention", "s": round(time.monotonic() - t0, 1)})
        console.rule(f"{label}: episodes")
        t0 = time.monotonic()
        episode_run = await run_episodes(
            episodes_config(config.quick, cores, config.host_limit, config.seed), console=console
        )
        parts.append({"host": name, "part": "episodes", "s": round(time.monotonic() - t0, 1)})
        configs[name] = {"contention": sweep.get("config"), "episodes": episode_run.get("config")}
        path = out / f"{name}.json"
        path.write_text(json.dumps(merge(sweep, episode_run)) + "\n")
        files[name] = str(path)
    table, compared = report.compare_files(files["hostA"], files["hostB"])
    console.print(table)
    (out / "compare.json").write_text(json.dumps(compared) + "\n")
    elapsed = round(time.monotonic() - started, 1)
    summary: dict[str, Any] = {
        "bench": "study",
        "version": RESULT_VERSION,
        "quick": config.quick,
        "hosts": {name: ("all" if cores is None else cores) for name, cores in hosts.items()},
        "host_limit": config.host_limit,
        "configs": configs,
        "parts": parts,
        "files": {**files, "compare": str(out / "compare.json"), "report": str(out / "report.html")},
        "duration_s": elapsed,
        "budget_s": BUDGET_S,
        "within_budget": elapsed <= BUDGET_S,
    }
    (out / "study.json").write_text(json.dumps(summary, default=str) + "\n")
    report.write_report([files["hostA"], files["hostB"]], out / "report.html", study=summary)
    console.print(
        f"study: {elapsed:.0f} s ({'within' if elapsed <= BUDGET_S else 'over'} the {BUDGET_S // 60}-minute budget); "
        f"wrote {', '.join(summary['files'].values())}"
    )
    return summary
