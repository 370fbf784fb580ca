"""``sandrl bench contention``: how much slower agents' commands get as a host fills up.

N *background tasks* keep running, each a sandbox looping over the workloads in its own
order (the other episodes of a busy host). At each N of a grid from 0 to well past the core
count, after the load settles, one more sandbox (the *probe*) times a stream of workload
commands; slowdown = time / standalone time, the standalone time being
:mod:`sandrl.bench.baseline`'s (measured at the start and again right before every level,
in two CPU states, pooled). Reported per level and per class: the distribution of slowdown
and the share within the bar with its exact interval; then

- **capacity**: the largest N at which at least ``quantile`` of the probe commands finish
  within ``bar`` x standalone (sweep, then bisection: :mod:`sandrl.bench.capacity`), with
  its interval from resampling the probes;
- **per-core slowdown at full load**: the median slowdown per class at N = cores - 1, where
  with the probe every core is busy and none is shared: what a loaded core costs (shared
  caches, memory bandwidth, frequency) apart from queueing.

Every sandbox has ``SandboxSpec.cpus`` (default one core) as its own quota; the host's size
can be emulated with :mod:`sandrl.bench.hostlimit`. A host too noisy to measure on gets a
one-line diagnosis (:mod:`sandrl.bench.noise`), and a per-core slowdown below 1 an explanation.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from rich.console import Console
from rich.progress import TaskID
from rich.table import Table

from sandrl.bench import capacity, hostlimit, noise, workloads
from sandrl.bench.baseline import STATES, Baseline, State, spinner_group
from sandrl.bench.workloads import Workload
from sandrl.errors import ConfigError, SandrlError
from sandrl.progress import Progress
from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider, BwrapSandbox

RESULT_VERSION = 2
SETUP_CONCURRENCY = 4
"""Background sandboxes prepared at once (input generation is CPU-bound)."""


@dataclass(frozen=True)
class ContentionConfig:
    """What the sweep measures and how much; None fields are filled from the host by :meth:`resolve`."""

    quick: bool = False
    """The small run (under 90 s on 2 cores): fewer workloads, shorter settles, and the grid only
    until the first failing level (higher ones cannot change the capacity)."""
    levels: tuple[int, ...] | None = None
    """Background-task counts; default :func:`~sandrl.bench.capacity.default_levels` of the cores."""
    bar: float = 1.5
    """A command is within the bar when it took at most this times its standalone time."""
    quantile: float = 0.95
    """A level passes when at least this fraction of its probe commands is within the bar."""
    probes: int | None = None
    """Probe commands per level (round-robin over the workloads); default 4 per workload quick (24),
    5 full (45): enough that one slow outlier does not fail a level at 95% (23 of 24 passes)."""
    workloads: tuple[str, ...] | None = None
    """Workload names; default :data:`~sandrl.bench.workloads.QUICK_NAMES` quick, all full."""
    cores: float | None = None
    """The emulated host's cores (``--cpus-per-host``); None: every usable CPU, no limit."""
    host_limit: Literal["auto", "affinity", "quota"] = "auto"
    sandbox_cpus: float = 1.0
    """Each sandbox's own CPU quota (``SandboxSpec.cpus``)."""
    memory_mb: int = 2048
    warmup: int = 1
    """Warm-up rounds before standalone; at least one runs (its times size the passes)."""
    repeats: int | None = None
    """Standalone passes per CPU state at the start (one more pair comes before every level);
    default 1 quick, 3 full."""
    awake: bool = True
    """Also measure standalone with every core kept awake (:mod:`sandrl.bench.awake`); False:
    the idle host only."""
    past_failure: int | None = None
    """Grid levels measured above the first failing one; default 0 quick, all full."""
    settle_s: float | None = None
    """Wait after changing the load before probing; default 1 s quick, 3 s full."""
    bisect: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if not 1.0 < self.bar < 1e6:
            raise ConfigError(f"--bar must be above 1 (a slowdown), got {self.bar}")
        if not 0.0 < self.quantile <= 1.0:
            raise ConfigError(f"--quantile must be in (0, 1], got {self.quantile}")
        if self.levels is not None and (not self.levels or any(n < 0 for n in self.levels)):
            raise ConfigError("--levels needs at least one background-task count, none negative")
        if self.probes is not None and self.probes < 1:
            raise ConfigError("--probes must be at least 1")
        if self.repeats is not None and self.repeats < 1:
            raise ConfigError("--repeats must be at least 1")
        workloads.select(self.workloads)

    def resolve(self, cores: float) -> ContentionConfig:
        """Every default filled in for a host of ``cores`` cores."""
        names = self.workloads or (workloads.QUICK_NAMES if self.quick else tuple(w.name for w in workloads.WORKLOADS))
        return replace(
            self,
            levels=tuple(sorted(set(self.levels or capacity.default_levels(cores, self.quick)))),
            workloads=names,
            probes=self.probes or (4 * len(names) if self.quick else 5 * len(names)),
            repeats=self.repeats or (1 if self.quick else 3),
            past_failure=self.past_failure if self.past_failure is not None or not self.quick else 0,
            settle_s=self.settle_s if self.settle_s is not None else (1.0 if self.quick else 3.0),
            cores=cores,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "quick": self.quick,
            "levels": list(self.levels or ()),
            "bar": self.bar,
            "quantile": self.quantile,
            "probes": self.probes,
            "workloads": list(self.workloads or ()),
            "cores": self.cores,
            "host_limit": self.host_limit,
            "sandbox_cpus": self.sandbox_cpus,
            "memory_mb": self.memory_mb,
            "warmup": self.warmup,
            "repeats": self.repeats,
            "awake": self.awake,
            "past_failure": self.past_failure,
            "settle_s": self.settle_s,
            "bisect": self.bisect,
            "seed": self.seed,
        }


@dataclass
class BackgroundLoad:
    """Sandboxes that loop over the workloads; :meth:`resize` sets how many run."""

    provider: BwrapProvider
    spec: SandboxSpec
    workloads: Sequence[Workload]
    seed: int = 0
    sandboxes: list[BwrapSandbox] = field(default_factory=list)
    loops: list[asyncio.Task[None]] = field(default_factory=list)
    commands: int = 0
    errors: list[str] = field(default_factory=list)

    async def _add(self) -> BwrapSandbox:
        sandbox = await self.provider.create(self.spec)
        try:
            await workloads.prepare(sandbox)
        except BaseException:
            await sandbox.close()
            raise
        return sandbox

    async def grow(self, n: int, tick: Callable[[], None] = lambda: None) -> None:
        """Make sure ``n`` prepared sandboxes exist."""
        sem = asyncio.Semaphore(SETUP_CONCURRENCY)

        async def one() -> None:
            async with sem:
                self.sandboxes.append(await self._add())
                tick()

        await asyncio.gather(*(one() for _ in range(n - len(self.sandboxes))))

    async def _loop(self, index: int, sandbox: BwrapSandbox) -> None:
        rng = random.Random(self.seed * 1000 + index)
        order = list(self.workloads)
        while True:
            rng.shuffle(order)
            for w in order:
                try:
                    await workloads.run(sandbox, w)
                    self.commands += 1
                except SandrlError as exc:
                    self.errors.append(str(exc))
                    await asyncio.sleep(0.5)

    async def resize(self, n: int) -> None:
        """Run exactly ``n`` loops (the sandboxes must exist: :meth:`grow`)."""
        while len(self.loops) > n:
            task = self.loops.pop()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        while len(self.loops) < n:
            i = len(self.loops)
            self.loops.append(asyncio.create_task(self._loop(i, self.sandboxes[i]), name=f"sandrl-bench-bg-{i}"))

    def cpu_seconds(self) -> float:
        return sum(s.stats().cpu_s for s in self.sandboxes)

    async def close(self) -> None:
        await self.resize(0)
        await asyncio.gather(*(s.close() for s in self.sandboxes), return_exceptions=True)
        self.sandboxes.clear()


@dataclass
class Sweep:
    """One contention run: the probe sandbox, the background load, the baseline, what was measured."""

    config: ContentionConfig
    probe: BwrapSandbox
    load: BackgroundLoad
    baseline: Baseline
    progress: Progress
    levels: dict[int, dict[str, Any]] = field(default_factory=dict)

    async def measure(self, n: int, source: str) -> dict[str, Any]:
        cfg = self.config
        assert cfg.probes is not None and cfg.settle_s is not None and cfg.cores is not None
        probe_workloads = workloads.select(cfg.workloads)
        # Standalone again right before the level, the background paused: the baseline follows
        # the host's drift over the run instead of being frozen at its start. (Not before the
        # first level: the start's passes were just measured.)
        if self.levels:
            await self.load.resize(0)
            alone = self.progress.add_task(
                f"standalone before load {n}", total=len(probe_workloads) * len(self.baseline.states)
            )
            await self.baseline.measure_pair(self.probe, f"before {n}", lambda: self.progress.advance(alone))
            self.progress.remove_task(alone)
        task: TaskID = self.progress.add_task(f"load {n:>3} ({source})", total=cfg.probes)
        if len(self.load.sandboxes) < n:
            grow = self.progress.add_task(f"preparing {n} background sandboxes", total=n - len(self.load.sandboxes))
            await self.load.grow(n, lambda: self.progress.advance(grow))
            self.progress.remove_task(grow)
        await self.load.resize(n)
        await asyncio.sleep(cfg.settle_s)
        cpu0, probe_cpu0, done0 = self.load.cpu_seconds(), self.probe.stats().cpu_s, self.load.commands
        meter = noise.Meter(lambda: self.load.cpu_seconds() + self.probe.stats().cpu_s)
        t0 = time.monotonic()
        probes: list[dict[str, Any]] = []
        for i in range(cfg.probes):
            w = probe_workloads[i % len(probe_workloads)]
            seconds = await workloads.run(self.probe, w)
            probes.append({"workload": w.name, "class": w.cls, "seconds": round(seconds, 5)})
            self.progress.advance(task)
        wall = time.monotonic() - t0
        host = meter.read()
        busy = self.load.cpu_seconds() - cpu0 + self.probe.stats().cpu_s - probe_cpu0
        self.progress.remove_task(task)
        level = {
            "background": n,
            "load_per_core": round(n / cfg.cores, 4),
            "source": source,
            "probes": probes,
            "background_commands": self.load.commands - done0,
            "cpu_utilization": round(busy / (wall * cfg.cores), 4) if wall > 0 else math.nan,
            "host_cpu": host,
            "wall_s": round(wall, 3),
        }
        judge(level, self.baseline, cfg)
        self.levels[n] = level
        return level

    async def evaluate(self, n: int, source: str) -> bool:
        return bool((await self.measure(n, source))["passed"])


def judge(level: dict[str, Any], baseline: Baseline, cfg: ContentionConfig) -> None:
    """(Re)compute a level's slowdowns, summaries and verdict against the baseline as it stands."""
    for p in level["probes"]:
        p["slowdown"] = round(p["seconds"] / baseline.seconds(p["workload"]), 4)
    slowdowns = [p["slowdown"] for p in level["probes"]]
    level["classes"] = capacity.by_class(((p["class"], p["slowdown"]) for p in level["probes"]), cfg.bar)
    level["share"] = capacity.share_section(slowdowns, cfg.bar, cfg.quantile)
    level["passed"] = level["share"]["passed"]


async def run(
    config: ContentionConfig | None = None,
    *,
    provider: BwrapProvider | None = None,
    state_dir: Path | None = None,
    console: Console | None = None,
) -> dict[str, Any]:
    """Run the sweep; print the table; return the JSON result."""
    config = config or ContentionConfig()
    console = console or Console(stderr=True)
    limit = hostlimit.plan(config.cores, config.host_limit, sandbox_cpus=config.sandbox_cpus)
    cfg = config.resolve(limit.cores)
    result = await hostlimit.run_on_host(
        limit, lambda p, _: _run(cfg, p, console), provider=provider, state_dir=state_dir
    )
    print_card(result, console)
    return result


async def _run(cfg: ContentionConfig, provider: BwrapProvider, console: Console) -> dict[str, Any]:
    chosen = workloads.select(cfg.workloads)
    spec = SandboxSpec(cpus=cfg.sandbox_cpus, memory_mb=cfg.memory_mb, ttl_s=6 * 3600)
    assert cfg.levels is not None and cfg.repeats is not None and cfg.cores is not None
    load = BackgroundLoad(provider, spec, chosen, seed=cfg.seed)
    watch = noise.RunWatch()
    states: tuple[State, ...] = STATES if cfg.awake else ("idle",)
    cpu_base = provider.cgroups.bases.get("cpu") or provider.cgroups.bases.get("unified")
    with Progress(console=console, transient=True) as progress, spinner_group(cpu_base if cfg.awake else None) as group:
        probe = await provider.create(spec)
        try:
            setup = progress.add_task("generating the workload inputs", total=None)
            await workloads.prepare(probe)
            progress.remove_task(setup)
            baseline = Baseline(chosen, states, spinner_group=group)
            rounds = max(1, cfg.warmup)
            alone = progress.add_task("standalone times", total=len(chosen) * (rounds + cfg.repeats * len(states)))
            tick = lambda: progress.advance(alone)  # noqa: E731
            await baseline.warm_up(probe, rounds, tick)
            for _ in range(cfg.repeats):
                await baseline.measure_pair(probe, "start", tick)
            progress.remove_task(alone)
            sweep = Sweep(cfg, probe, load, baseline, progress)
            found = await capacity.find_capacity(
                cfg.levels,
                sweep.evaluate,
                bisect=cfg.bisect,
                past_failure=cfg.past_failure,
                through=capacity.full_load_background(cfg.cores),
                clear=lambda n: bool(sweep.levels[n]["share"]["clear"]),
            )
        finally:
            await load.close()
            await probe.close()
    return _result(cfg, sweep, found, load.errors, watch.read())


def _result(
    cfg: ContentionConfig,
    sweep: Sweep,
    found: capacity.Capacity,
    background_errors: list[str],
    run_info: dict[str, Any],
) -> dict[str, Any]:
    assert cfg.cores is not None
    # Every level judged again against the final baseline (every pass pooled): the capacity is
    # what those verdicts say; ``evaluated`` keeps the verdicts the sweep steered by.
    levels = [sweep.levels[n] for n in sorted(sweep.levels)]
    for lv in levels:
        judge(lv, sweep.baseline, cfg)
    cap = capacity.settle({lv["background"]: lv["passed"] for lv in levels}, found.evaluated)
    interval = capacity.capacity_interval(
        {lv["background"]: [p["slowdown"] for p in lv["probes"]] for lv in levels}, cfg.bar, cfg.quantile, seed=cfg.seed
    )
    classes = [c for c in workloads.CLASSES if any(c in lv["classes"] for lv in levels)]
    per_class_capacity = {
        cls: capacity.capacity_from(
            {lv["background"]: lv["classes"][cls]["within_bar"] >= cfg.quantile - 1e-12 for lv in levels}
        )
        for cls in classes
    }
    full = capacity.full_load_background(cfg.cores)
    full_level = sweep.levels.get(full)
    baseline = sweep.baseline.to_dict()
    idle_level = levels[0] if levels and levels[0]["background"] == 0 else None
    found_noise = noise.findings(idle_level=idle_level, baseline=baseline, run=run_info)
    per_core: dict[str, float] | None = None
    per_core_idle: dict[str, float] | None = None
    if full_level is not None:
        per_core = {cls: full_level["classes"][cls]["p50"] for cls in classes}
        per_core_idle = {
            cls: round(
                statistics.median(
                    p["seconds"] / sweep.baseline.idle_seconds(p["workload"])
                    for p in full_level["probes"]
                    if p["class"] == cls
                ),
                4,
            )
            for cls in classes
        }
    return {
        "bench": "contention",
        "version": RESULT_VERSION,
        "config": cfg.to_dict(),
        "standalone": {
            name: {**s.to_dict(), **baseline["workloads"][name]} for name, s in sweep.baseline.standalone().items()
        },
        "baseline": baseline,
        "levels": levels,
        "capacity": {
            **cap.to_dict(),
            "bar": cfg.bar,
            "quantile": cfg.quantile,
            "per_core": round(cap.load / cfg.cores, 4) if cap.load is not None else None,
            "per_class": per_class_capacity,
            "interval": interval,
            "diagnosis": noise.diagnosis(idle_level, found_noise),
        },
        "full_load": {
            "background": full,
            "busy_sandboxes": full + 1,
            "definition": "every core busy: cores - 1 background tasks plus the probe",
            "per_core_slowdown": per_core,
            "per_core_slowdown_idle_baseline": per_core_idle,
            "explanation": noise.explain_full_load(per_core, per_core_idle or {}, found_noise) if per_core else None,
            "cpu_utilization": full_level["cpu_utilization"] if full_level is not None else None,
        },
        "host_noise": {"quiet": not found_noise, "findings": found_noise, "run": run_info},
        "background_errors": background_errors[:20],
        "episodes": None,
        "projection": None,
    }


def print_card(result: dict[str, Any], console: Console) -> None:
    """The table people read (the JSON line follows it, printed by the CLI)."""
    host = result["host"]
    classes = [c for c in workloads.CLASSES if any(c in lv["classes"] for lv in result["levels"])]
    cap = result["capacity"]
    table = Table(
        title=f"sandrl bench contention: {host['cpu_model']}, {host['cores']:g} cores "
        f"(limit: {host['host_limit']['mode']}), bar {cap['bar']}x at {cap['quantile']:.0%}",
        caption="bg: background tasks (* bisection); ok: share within the bar; within: all probes, with the "
        "exact 95% interval; cpu: the host's cores busy with ours; others: cores busy with other work",
    )
    short = {"python": "py", "compile": "cc", "shell": "sh"}
    table.add_column("bg", justify="right")
    table.add_column("/core", justify="right")
    for cls in classes:
        table.add_column(f"{short[cls]} p50/p95", justify="right")
        table.add_column(f"{short[cls]} ok", justify="right")
    table.add_column("within [95% CI]", justify="right")
    table.add_column("cpu", justify="right")
    table.add_column("others", justify="right")
    table.add_column("pass", justify="center")
    for lv in result["levels"]:
        row = [f"{lv['background']}{'*' if lv['source'] == 'bisect' else ''}", f"{lv['load_per_core']:.2f}"]
        for cls in classes:
            s = lv["classes"].get(cls)
            row += [f"{s['p50']:.2f}/{s['p95']:.2f}", f"{s['within_bar']:.0%}"] if s else ["-", "-"]
        share = lv["share"]
        lo, hi = share["interval"]
        row += [
            f"{share['within']}/{share['n']} [{lo:.2f}-{hi:.2f}]",
            f"{lv['cpu_utilization']:.0%}",
            f"{lv['host_cpu']['others_cores']:.2f}",
            "yes" if lv["passed"] else "no",
        ]
        table.add_row(*row)
    console.print(table)
    iv = cap["interval"]
    if cap["load"] is None:
        console.print(f"capacity: not measurable on this host now: {cap['diagnosis']}", highlight=False)
    else:
        bound = " (at least: no measured load above it failed)" if cap["bound"] == "lower" else ""
        console.print(
            f"capacity: {cap['load']} background tasks{bound}; {iv['coverage']:.0%} interval "
            f"{iv['low'] if iv['low'] is not None else 'none'}-{iv['high']} (resampled probes: {iv['distribution']}); "
            f"per class: {cap['per_class']}",
            highlight=False,
        )
    full = result["full_load"]
    console.print(
        f"per-core slowdown at full load ({full['definition']}): {full['per_core_slowdown']}; "
        f"against the idle-host baseline: {full['per_core_slowdown_idle_baseline']}"
    )
    if full["explanation"]:
        console.print(f"  {full['explanation']}")
    ratios = {n: w["awake_over_idle"] for n, w in result["baseline"]["workloads"].items() if w.get("awake_over_idle")}
    if ratios:
        console.print(f"standalone awake / idle (median): {ratios}")
    noisy = result["host_noise"]
    console.print(f"host: {'quiet' if noisy['quiet'] else '; '.join(noisy['findings'])}")
    console.print(f"took {result['duration_s']:.0f} s")
