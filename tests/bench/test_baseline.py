"""The standalone baseline (two CPU states, pooled passes), the awake loops, and the noise diagnosis."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sandrl.bench import awake, baseline, hostinfo, noise, workloads
from sandrl.bench.baseline import Baseline


@dataclass
class _Result:
    ok: bool
    duration_s: float
    exit_code: int = 0
    timed_out: bool = False
    stderr: str = ""


@dataclass
class _Stats:
    cpu_s: float


class FakeSandbox:
    """Times each workload from a table; awake runs take ``awake_factor`` times as long."""

    def __init__(self, times: dict[str, float], awake_factor: float = 1.0) -> None:
        self.times = times
        self.awake_factor = awake_factor
        self.awake_now = False
        self.cpu = 0.0

    async def exec(self, command: str, **_: Any) -> _Result:
        name = next(w.name for w in workloads.WORKLOADS if w.command == command)
        seconds = self.times[name] * (self.awake_factor if self.awake_now else 1.0)
        self.cpu += seconds
        return _Result(True, seconds)

    def stats(self) -> _Stats:
        return _Stats(self.cpu)


def test_runs_per_pass_gives_short_commands_more_samples() -> None:
    assert baseline.runs_per_pass(1.0) == 1
    assert baseline.runs_per_pass(0.1) == 3
    assert baseline.runs_per_pass(0.01) == baseline.MAX_PER_PASS
    assert baseline.cv([1.0, 1.0]) == 0.0 and baseline.cv([1.0]) == 0.0
    assert baseline.cv([1.0, 3.0]) == pytest.approx(0.5)


async def test_baseline_takes_the_faster_state_and_keeps_both(monkeypatch: pytest.MonkeyPatch) -> None:
    chosen = workloads.select(["cpu_script", "sort_uniq"])
    box = FakeSandbox({"cpu_script": 0.2, "sort_uniq": 0.1}, awake_factor=0.8)
    original = baseline.Baseline.measure_pass

    async def measure_pass(self: Baseline, sandbox: Any, state: Any, label: str, tick: Any = lambda: None) -> None:
        box.awake_now = state == "awake"
        await original(self, sandbox, state, label, tick)

    monkeypatch.setattr(baseline.Baseline, "measure_pass", measure_pass)
    b = Baseline(chosen)
    await b.warm_up(box)  # type: ignore[arg-type]
    assert b.per_pass == {"cpu_script": 2, "sort_uniq": 3}
    for label in ("start", "before 0", "before 1"):
        await b.measure_pair(box, label)  # type: ignore[arg-type]
    assert b.state_for("cpu_script") == "awake" and b.seconds("cpu_script") == pytest.approx(0.16)
    assert b.idle_seconds("cpu_script") == pytest.approx(0.2)
    out = b.to_dict()
    row = out["workloads"]["sort_uniq"]
    assert row["idle_n"] == 9 and row["awake_n"] == 9 and row["awake_over_idle"] == pytest.approx(0.8)
    assert row["drift"] == 1.0
    assert [p["label"] for p in out["passes"]] == ["start", "start", "before 0", "before 0", "before 1", "before 1"]
    assert out["awake_loops"]["cpu_s"] >= 0.0
    standalone = b.standalone()
    assert standalone["cpu_script"].median_s == pytest.approx(0.16) and len(standalone["cpu_script"].runs_s) == 6


def test_spinners_keep_cores_busy_and_stop() -> None:
    cpu = sorted(os.sched_getaffinity(0))[-1]
    with awake.awake(cpus=[cpu]) as spinners:
        assert spinners is not None and len(spinners.procs) == 1
        pids = [p.pid for p in spinners.procs]
        time.sleep(0.3)
        assert spinners.cpu_s() > 0.0
        assert os.sched_getscheduler(pids[0]) == os.SCHED_IDLE
    assert all(not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text() for pid in pids)
    with awake.awake(False) as none:
        assert none is None


def test_make_group_sets_the_least_weight(tmp_path: Path) -> None:
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "cpu.shares").write_text("1024")
    group = awake.make_group(tmp_path, "g")
    assert group is not None and (group / "cpu.shares").read_text() == "2"
    assert awake.make_group(tmp_path / "missing", "g") is None


def test_cpu_times_reads_proc_stat(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  9 9 9 9 9 9 9 9 0 0\ncpu0 100 0 50 800 10 5 5 30 0 0\ncpu1 1 1 1 1 1 1 1 1 0 0\n")
    t = hostinfo.cpu_times([0], stat)
    assert (t.busy, t.idle, t.steal) == (160, 810, 30)
    later = hostinfo.CpuTimes(t.busy + 100, t.idle + 80, t.steal + 20, t.at + 1.0)
    delta = later.since(t)
    assert delta["steal_share"] == pytest.approx(0.1)
    assert delta["busy_cores"] == pytest.approx(100 / os.sysconf("SC_CLK_TCK"))


def _idle_level(passed: bool, others: float) -> dict[str, Any]:
    return {
        "background": 0,
        "passed": passed,
        "share": {"within": 20 if not passed else 24, "n": 24},
        "classes": {"all": {"p50": 1.2}},
        "host_cpu": {"others_cores": others},
    }


RUN = {"steal_share": 0.0, "load_average_start": [7.8, 6.0, 5.0], "cpu_mhz": None}
QUIET_BASELINE = {"workloads": {"a": {"state": "idle", "idle_cv": 0.05, "drift": 1.02}}, "passes": []}


def test_a_quiet_host_has_no_findings_and_no_diagnosis() -> None:
    assert noise.findings(idle_level=_idle_level(True, 0.05), baseline=QUIET_BASELINE, run=RUN) == []
    assert noise.diagnosis(_idle_level(True, 0.05), []) is None


def test_a_failing_idle_level_gets_one_line_saying_why() -> None:
    level = _idle_level(False, 1.3)
    noisy = {"workloads": {"a": {"state": "idle", "idle_cv": 0.3, "drift": 0.6}}, "passes": []}
    found = noise.findings(idle_level=level, baseline=noisy, run={**RUN, "steal_share": 0.08})
    assert [f.split(":")[0] for f in found] == ["other work", "steal", "spread", "drift"]
    line = noise.diagnosis(level, found)
    assert line is not None and "\n" not in line
    assert line.startswith("even the idle level failed (20 of 24") and "1.30 cores" in line and "steal" in line
    unexplained = noise.diagnosis(level, [])
    assert unexplained is not None and "no noise source" in unexplained
    mhz = noise.findings(idle_level=None, baseline=QUIET_BASELINE, run={**RUN, "cpu_mhz": {"min": 1500, "max": 3000}})
    assert mhz and mhz[0].startswith("frequency scaling")


def test_a_per_core_slowdown_below_one_is_explained() -> None:
    assert noise.explain_full_load({"python": 1.1, "shell": 1.0}, {}, []) is None
    text = noise.explain_full_load({"python": 0.8, "shell": 1.2}, {"python": 0.7}, ["drift: -20%"])
    assert text is not None and "python 0.80" in text and "python 0.70" in text and "drift" in text
    assert "shell" not in text.split("Against")[0]
