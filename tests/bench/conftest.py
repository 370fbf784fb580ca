"""Fixtures for the benchmark tests: hand-made results, and real sandboxes where a test needs them."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandrl.bench.breakdown import EpisodeBreakdown, KvUsage, episodes_section
from sandrl.bench.projection import projection_section
from sandrl.sandbox.bwrap import BwrapProvider

from ..support import REASON


@pytest.fixture(scope="session")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BwrapProvider]:
    if REASON is not None:
        pytest.skip(REASON)
    p = BwrapProvider(tmp_path_factory.mktemp("sandrl-bench-state"))
    yield p
    p._close_all_sync()


def _level(n: int, cores: float, p50: float, p95: float, within: float, passed: bool) -> dict[str, Any]:
    stats = {"n": 4.0, "p50": p50, "p95": p95, "max": p95, "mean": p50, "within_bar": within}
    return {
        "background": n,
        "load_per_core": n / cores,
        "source": "sweep",
        "passed": passed,
        "classes": {"python": dict(stats), "compile": dict(stats), "shell": dict(stats), "all": dict(stats)},
        "probes": [],
        "background_commands": 3 * n,
        "cpu_utilization": min(1.0, (n + 1) / cores),
        "wall_s": 1.0,
    }


def _episode(model: float, commands: float, verifier: float, kv: KvUsage) -> EpisodeBreakdown:
    return EpisodeBreakdown(model + commands + verifier + 0.55, model, commands, verifier, 0.05, kv)


def synthetic_result(cores: float, *, capacity: int, slow: float, episodes: bool = True) -> dict[str, Any]:
    """A contention result in the real schema with made-up numbers (and, optionally, an episode run)."""
    levels = [
        _level(n, cores, 1.0 + slow * n / cores, 1.1 + slow * n / cores, 1.0, n <= capacity) for n in (0, 1, 2, 4)
    ]
    result: dict[str, Any] = {
        "bench": "contention",
        "version": 1,
        "host": {
            "hostname": "test",
            "cpu_model": "Test CPU",
            "machine_cpus": 2,
            "usable_cpus": int(cores),
            "cores": float(cores),
            "memory_mib": 1024,
            "kernel": "Linux 6.1",
            "arch": "x86_64",
            "python": "3.11",
            "sandbox_backend": "bwrap",
            "cgroup_version": 1,
            "host_limit": {"mode": "none", "cores": cores, "cpus": []},
        },
        "config": {"bar": 1.5, "quantile": 0.95},
        "standalone": {
            "cpu_script": {"class": "python", "median_s": 0.2, "runs_s": [0.2]},
            "gcc_O2": {"class": "compile", "median_s": 0.5, "runs_s": [0.5]},
            "sort_uniq": {"class": "shell", "median_s": 0.1, "runs_s": [0.1]},
        },
        "levels": levels,
        "capacity": {
            "load": capacity,
            "bound": "exact",
            "bracket": [capacity, capacity + 1],
            "evaluated": [],
            "bar": 1.5,
            "quantile": 0.95,
            "per_core": capacity / cores,
            "per_class": {"python": capacity, "compile": capacity, "shell": capacity},
        },
        "full_load": {
            "background": int(cores) - 1,
            "busy_sandboxes": int(cores),
            "definition": "every core busy",
            "per_core_slowdown": {"python": 1.0 + slow / 10, "compile": 1.1, "shell": 1.05},
            "cpu_utilization": 1.0,
        },
        "background_errors": [],
        "episodes": None,
        "projection": None,
        "duration_s": 1.0,
    }
    if episodes:
        eps = [
            _episode(6.0, 2.0 * slow, 1.0, KvUsage(100.0, 50.0 * slow)),
            _episode(8.0, 2.0 * slow + 1, 1.5, KvUsage(140.0, 60.0 * slow)),
        ]
        result["episodes"] = episodes_section(eps, agent="replay")
        result["projection"] = projection_section(EpisodeBreakdown.from_dict(result["episodes"]["mean"]))
    return copy.deepcopy(result)


@pytest.fixture
def two_results(tmp_path: Path) -> tuple[Path, Path]:
    import json

    a, b = tmp_path / "hostA.json", tmp_path / "hostB.json"
    a.write_text(json.dumps(synthetic_result(2, capacity=2, slow=1.0)))
    b.write_text(json.dumps(synthetic_result(1, capacity=1, slow=2.0)))
    return a, b
