"""``sandrl bench ...``: every benchmark, each a thin command over its module in :mod:`sandrl.bench`
(or :mod:`sandrl.bench.inference`, :mod:`sandrl.bench.cluster`).

Each prints its card on stderr (nothing with ``--json``) and ends with one JSON line on stdout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, cast

import typer

from sandrl.cli import bench_inference
from sandrl.cli.output import emit, rich_console, sandboxes_help
from sandrl.errors import ConfigError, SandrlError

app = typer.Typer(no_args_is_help=True, help="Benchmarks; each ends with one JSON line.")

LimitChoice = Literal["auto", "affinity", "quota"]


def _host_limit(value: str) -> LimitChoice:
    """``--host-limit``, checked once for every command that emulates a smaller host."""
    if value not in ("auto", "affinity", "quota"):
        raise ConfigError(f"--host-limit is auto, affinity or quota, not {value!r}")
    return cast(LimitChoice, value)


def parse_levels(text: str | None) -> tuple[int, ...] | None:
    """``"0,1,2,4"`` -> (0, 1, 2, 4); None or empty -> None (the defaults)."""
    if not text:
        return None
    try:
        return tuple(int(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError as exc:
        raise ConfigError(f"--levels takes whole numbers separated by commas (e.g. 0,2,4,8), got {text!r}") from exc


def _names(text: str | None, what: str) -> tuple[str, ...] | None:
    if text is None:
        return None
    names = tuple(n for n in text.replace(" ", "").split(",") if n)
    if not names:
        raise ConfigError(f"{what} takes names separated by commas")
    return names


@app.command("service")
def bench_service(
    concurrency: list[int] = typer.Option([], help="Concurrent clients (repeatable; default 1, 16, 64, 256)."),
    n_exec: int = typer.Option(300, help="Execs for the one-client round-trip measure."),
    rounds: int = typer.Option(2, help="Bursts of each mode per level, alternating which goes first."),
    min_cycles: int = typer.Option(64, help="Cycles per burst at least (a client runs several when few)."),
    transport: str = typer.Option(
        "channel",
        help="'channel' (the client's default: calls multiplexed on one connection) or 'http' (a request each).",
    ),
    json_only: bool = typer.Option(False, "--json", help="Print only the JSON line."),
) -> None:
    """The sandbox service over HTTP beside the in-process provider."""
    from sandrl.bench.service import LEVELS, run

    if transport not in ("channel", "http"):
        raise ConfigError(f"--transport is 'channel' or 'http', not {transport!r}")

    if any(c < 1 for c in concurrency) or n_exec < 1 or rounds < 1 or min_cycles < 1:
        raise SandrlError("--concurrency, --n-exec, --rounds and --min-cycles must be at least 1")
    console = rich_console(quiet=json_only)
    levels = tuple(concurrency) or LEVELS
    result = asyncio.run(
        run(levels, n_exec, console=console, rounds=rounds, min_cycles=min_cycles, channel=transport == "channel")
    )
    emit(result)


@app.command("rollout")
def bench_rollout(
    episodes: int | None = typer.Option(None, help="Episodes in all (default 256; --fork-groups: 32)."),
    concurrency: int | None = typer.Option(None, help="Episodes at once (default 256; --fork-groups: 16)."),
    suite: str = typer.Option("generated", help="'generated' or 'builtin'."),
    think_min_s: float | None = typer.Option(None, help="Shortest model time per turn (1; --fork-groups 0.5)."),
    think_max_s: float | None = typer.Option(None, help="Longest model time per turn (2; --fork-groups 1)."),
    fork_groups: bool = typer.Option(
        False,
        "--fork-groups",
        help="On setup-heavy tasks: groups forked from one set-up sandbox against a setup per episode, same run.",
    ),
    group_size: int = typer.Option(8, help="--fork-groups: episodes per group (--episodes is rounded to groups)."),
    sandboxes: str | None = typer.Option(None, help=sandboxes_help("local")),
    json_only: bool = typer.Option(False, "--json", help="Print only the JSON line."),
) -> None:
    """Concurrent replay episodes with the model's time fixed: infra errors and orchestrator overhead."""
    from sandrl.bench.rollout import run

    if suite not in ("generated", "builtin"):
        raise SandrlError("--suite must be 'generated' or 'builtin'")
    episodes = episodes if episodes is not None else (32 if fork_groups else 256)
    concurrency = concurrency if concurrency is not None else (16 if fork_groups else 256)
    think_min_s = think_min_s if think_min_s is not None else (0.5 if fork_groups else 1.0)
    think_max_s = think_max_s if think_max_s is not None else (1.0 if fork_groups else 2.0)
    if episodes < 1 or concurrency < 1 or group_size < 1 or not 0 < think_min_s <= think_max_s:
        raise SandrlError(
            "--episodes, --concurrency and --group-size must be at least 1, and 0 < --think-min-s <= --think-max-s"
        )
    console = rich_console(quiet=json_only)
    if fork_groups:
        from sandrl.bench import fork_groups as forks

        groups = max(1, round(episodes / group_size))
        think = (think_min_s, think_max_s)
        where = sandboxes or "local"
        emit(asyncio.run(forks.run(groups, group_size, concurrency, think_s=think, sandboxes=where, console=console)))
        return
    result = asyncio.run(
        run(
            episodes,
            concurrency,
            suite=suite,  # type: ignore[arg-type]
            think_s=(think_min_s, think_max_s),
            progress=not json_only,
            sandboxes=sandboxes or "local",
            console=console,
        )
    )
    emit(result)


@app.command("train")
def bench_train(
    quick: bool = typer.Option(False, "--quick", help="A smoke run of seconds: the result's shape, not its ratio."),
    steps: int | None = typer.Option(None, help="Training steps in each mode (default 10)."),
    max_staleness: int | None = typer.Option(None, help="The async driver's staleness bound (default 2)."),
    on_stale: str | None = typer.Option(None, help="drop or regenerate a too-stale group (default drop)."),
    median_s: float | None = typer.Option(None, help="Median command time in seconds (default 0.8)."),
    sigma: float | None = typer.Option(None, help="Lognormal sigma of command times: the tail (default 1.2)."),
    seed: int = typer.Option(0, help="Seeds the tasks, their order and the command times."),
    scale: bool = typer.Option(
        False,
        "--scale",
        help="Instead: the trainer's memory at scale on the CPU (2 ranks vs 1 process, LoRA, bf16, packing on the "
        "demo's episodes, chunked log-probs), each against its target; exit status 1 when one is missed.",
    ),
    estimators: bool = typer.Option(
        False,
        "--estimators",
        help="Instead: the demo's held-out gain with each loss (GRPO/DAPO, GSPO, RLOO, REINFORCE++) over RL seeds, "
        "from one warm start, with the async runs' mismatch KL and masked share by staleness. Hours (12 demo runs); "
        "--quick: seconds. A measurement: no target.",
    ),
    seeds: int | None = typer.Option(None, help="With --estimators: RL seeds 0..N-1 per row (default 3; --quick 1)."),
    rows: str | None = typer.Option(
        None,
        help="With --estimators: the losses, comma-separated, of dapo, gspo, rloo, reinforce_pp, cispo, icepop "
        "(default the first four; --quick dapo,gspo).",
    ),
    out: Path | None = typer.Option(
        None,
        help="With --estimators: where the runs are written (default runs/bench-estimators, its warm start reused "
        "by a rerun; --quick: a temporary directory).",
    ),
    json_only: bool = typer.Option(False, "--json", help="Print only the JSON line."),
) -> None:
    """Async vs sync training on a long tail of command times: episodes per hour, same tasks, model and budget.
    With --scale, what the trainer's scale features save, against their targets; with --estimators, what each
    loss gains on the demo."""
    async_vs_sync: dict[str, object] = {"--steps": steps, "--max-staleness": max_staleness, "--on-stale": on_stale}
    async_vs_sync |= {"--median-s": median_s, "--sigma": sigma, "--seed": seed or None}
    by_loss: dict[str, object] = {"--seeds": seeds, "--rows": rows, "--out": out}
    if scale and estimators:
        raise ConfigError("--scale and --estimators are two benchmarks: give one of them")
    if scale:
        _refuse("--scale", "--quick and --json", {"the async vs sync bench": async_vs_sync, "--estimators": by_loss})
        _bench_train_scale(quick, json_only)
        return
    if estimators:
        takes = "--quick, --seeds, --rows, --out and --json"
        _refuse("--estimators", takes, {"the async vs sync bench": async_vs_sync})
        _bench_train_estimators(quick, seeds, _names(rows, "--rows"), out, json_only)
        return
    _refuse("the async vs sync bench", "its own options", {"--estimators": by_loss})
    from sandrl.bench.train import options, run

    settings = options(
        quick=quick,
        steps=steps,
        max_staleness=max_staleness,
        on_stale=on_stale,
        median_s=median_s,
        sigma=sigma,
        seed=seed,
    )
    console = rich_console(quiet=json_only)
    emit(asyncio.run(run(settings, console=console)))


def _refuse(bench: str, takes: str, others: Mapping[str, Mapping[str, object]]) -> None:
    """A flag of another benchmark given to ``bench``: refused, saying whose it is."""
    owned = []
    for owner, flags in others.items():
        named = [k for k, v in flags.items() if v is not None]
        if named:
            owned.append(f"{', '.join(named)} {'belongs' if len(named) == 1 else 'belong'} to {owner}")
    if owned:
        raise ConfigError(f"{bench} takes only {takes}; {'; '.join(owned)}")


def _bench_train_estimators(
    quick: bool, seeds: int | None, rows: tuple[str, ...] | None, out: Path | None, json_only: bool
) -> None:
    from sandrl.demo.estimators import options, run

    settings = options(quick=quick, seeds=seeds, rows=rows)  # checked before anything starts
    where = out if out is not None or quick else Path("runs/bench-estimators")
    emit(asyncio.run(run(settings, out=where, console=rich_console(quiet=json_only, wide=True))))


def _bench_train_scale(quick: bool, json_only: bool) -> None:
    from sandrl.bench.train_scale import QUICK, ScaleSettings, run
    from sandrl.demo.learn import DemoConfig, rl_config

    demo = rl_config(DemoConfig())  # its tasks, episodes and token budget; nothing is written
    result = run(QUICK if quick else ScaleSettings(), demo, console=rich_console(quiet=json_only, wide=True))
    emit(result)
    if not result["met"]:
        raise typer.Exit(1)


@app.command("images")
def bench_images(
    layers: int = typer.Option(4, help="Layers of the pulled image."),
    files: int = typer.Option(1500, help="Files per layer."),
    file_kib: int = typer.Option(16, help="Size of each file in KiB (half random, half text: ~2:1 gzip)."),
    repeat: int = typer.Option(3, help="Pulls by each tool (alternating)."),
    n_exec: int = typer.Option(20, help="Cached-FROM and host first execs."),
    dataset: bool = typer.Option(
        False, "--dataset", help="Instead: a dataset's images fetched ahead of its episodes vs pulled in the loop."
    ),
    quick: bool = typer.Option(False, "--quick", help="With --dataset: 6 tasks, 3 images of 1 MB (seconds)."),
    tasks: int = typer.Option(50, help="With --dataset: tasks."),
    images: int = typer.Option(10, help="With --dataset: distinct images (task i runs in image i mod this)."),
    image_mb: int = typer.Option(16, help="With --dataset: MB of each image's own layer."),
    groups_per_step: int = typer.Option(5, help="With --dataset: groups a step of the loop."),
    jobs: int = typer.Option(4, help="With --dataset: images fetched ahead at once."),
    think_s: float = typer.Option(1.0, help="With --dataset: each episode's model time (its solution sleeps)."),
    json_only: bool = typer.Option(False, "--json", help="Print only the JSON line."),
) -> None:
    """Pull + unpack from a loopback registry: sandrl vs skopeo + umoci; shared layers; cached FROM to
    first exec. With --dataset: every image of a 50-task dataset ready, and the episodes' waits, with
    the images fetched ahead against pulled when their first episode starts."""
    console = rich_console(quiet=json_only)
    if dataset:
        from sandrl.bench.image_dataset import QUICK, DatasetSettings, render_card
        from sandrl.bench.image_dataset import run as run_dataset

        settings = (
            QUICK
            if quick
            else DatasetSettings(
                tasks=tasks,
                images=images,
                image_mb=image_mb,
                groups_per_step=groups_per_step,
                jobs=jobs,
                think_s=think_s,
            )
        )
        outcome = asyncio.run(run_dataset(settings, console=console))
        console.print(render_card(outcome))
        emit(outcome)
        if not all(outcome["met"].values()):
            raise typer.Exit(1)
        return
    if quick:
        raise ConfigError("--quick is a form of --dataset: give both")
    from sandrl.bench.images import run

    if min(layers, files, file_kib, repeat, n_exec) < 1:
        raise SandrlError("--layers, --files, --file-kib, --repeat and --n-exec must be at least 1")
    result = asyncio.run(
        run(layers=layers, files=files, file_size=file_kib << 10, repeat=repeat, n_exec=n_exec, console=console)
    )
    emit(result)


@app.command("sandbox")
def bench_sandbox(
    n: int = typer.Option(200, help="Repetitions of each latency measure."),
    live: int = typer.Option(500, help="Idle sandboxes live at once for the memory measure."),
    pool_size: int = typer.Option(8, help="Warm pool size."),
    json_only: bool = typer.Option(False, "--json", help="Print only the JSON line."),
) -> None:
    """Sandbox start-up, exec latency and idle footprint against plain subprocess and bare bwrap."""
    from sandrl.bench.sandbox import run

    if n < 1 or live < 1 or pool_size < 1:
        raise SandrlError("--n, --live and --pool-size must be at least 1")
    console = rich_console(quiet=json_only)
    result = asyncio.run(run(n=n, live=live, pool_size=pool_size, console=console))
    emit(result)


@app.command("density")
def bench_density(
    live: int = typer.Option(10_000, help="Idle sandboxes live at once."),
    samples: int = typer.Option(50, help="Warm creates measured at each level (0, 1,000 and --live live)."),
    net_share: float = typer.Option(0.05, help="The share of the live sandboxes with network=True."),
    json_only: bool = typer.Option(False, "--json", help="Print only the JSON line."),
) -> None:
    """Many idle live sandboxes: host memory each, warm create at 0, 1,000 and N live, close all, leftovers."""
    from sandrl.bench.density import run

    if live < 1 or samples < 1 or not 0 <= net_share <= 1:
        raise SandrlError("--live and --samples must be at least 1, and --net-share between 0 and 1")
    console = rich_console(quiet=json_only)
    emit(asyncio.run(run(live=live, samples=samples, net_share=net_share, console=console)))


@app.command("cluster")
def bench_cluster(
    episodes: int = typer.Option(32, help="Episodes on each side (groups of 2)."),
    concurrency: int = typer.Option(16, help="Episodes at once on each side (on Ray: split over 2 workers)."),
    think_s: float = typer.Option(2.0, help="Emulated model time per turn (3 turns an episode)."),
    ray: str | None = typer.Option(None, help="A Ray cluster to use (auto or ADDRESS); default: start one here."),
    json_only: bool = typer.Option(False, "--json", help="Print only the JSON line."),
) -> None:
    """The same episodes in process and on Ray with two sandbox hosts: orchestration overhead per episode."""
    from sandrl.bench.cluster import run

    console = rich_console(quiet=json_only)
    result = asyncio.run(run(episodes=episodes, concurrency=concurrency, think_s=think_s, address=ray, console=console))
    emit(result)


@app.command("contention")
def contention(
    quick: bool = typer.Option(
        False, "--quick", help="The small run (under 90 s on 2 cores): the grid up to its first failing level."
    ),
    levels: str | None = typer.Option(None, help="Background-task counts, e.g. 0,2,4,8 (default: scaled to cores)."),
    bar: float = typer.Option(1.5, help="Slowdown bar: time / standalone at most this."),
    quantile: float = typer.Option(0.95, help="Fraction of commands that must be within the bar."),
    cpus_per_host: float | None = typer.Option(None, help="Emulate a host of this many cores (default: all)."),
    host_limit: str = typer.Option("auto", help="How to emulate it: auto, affinity (pin) or quota (CFS)."),
    probes: int | None = typer.Option(None, help="Probe commands per level."),
    workloads: str | None = typer.Option(None, help="Workload names, comma-separated (default: all; --quick: 6)."),
    repeats: int | None = typer.Option(None, help="Standalone passes per CPU state at the start (1 quick, 3 full)."),
    awake: bool = typer.Option(
        True, "--awake/--idle-only", help="Also measure standalone with every core kept awake (SCHED_IDLE loops)."
    ),
    out: Path | None = typer.Option(None, help="Also write the JSON result to this file."),
    json_only: bool = typer.Option(False, "--json", help="Print only the JSON line."),
) -> None:
    """Commands' slowdown as background sandboxes fill the host; capacity at the latency bar, with its interval."""
    from sandrl.bench.contention import ContentionConfig, run

    config = ContentionConfig(
        repeats=repeats,
        awake=awake,
        quick=quick,
        levels=parse_levels(levels),
        bar=bar,
        quantile=quantile,
        cores=cpus_per_host,
        host_limit=_host_limit(host_limit),
        probes=probes,
        workloads=tuple(w for w in workloads.split(",") if w) if workloads else None,
    )
    console = rich_console(quiet=json_only, wide=True)
    result = asyncio.run(run(config, console=console))
    emit(result, out)


@app.command("episodes")
def episodes(
    quick: bool = typer.Option(False, "--quick", help="The small run: under 3 minutes on 2 cores."),
    n: int | None = typer.Option(None, "--episodes", "-n", help="Episodes in all (default 8 quick, 24 full)."),
    tasks: str | None = typer.Option(None, help="Built-in task ids, comma-separated, or 'all' (default: a mix)."),
    background: int | None = typer.Option(None, help="Background tasks keeping the host busy (default: its cores)."),
    model_s: float | None = typer.Option(None, help="Emulated model seconds per turn (default 1 quick, 2 full)."),
    tokens_per_s: float = typer.Option(50.0, help="Emulated decode speed, for the KV-cache tokens."),
    concurrency: int = typer.Option(2, help="Episodes at once."),
    cpus_per_host: float | None = typer.Option(None, help="Emulate a host of this many cores (default: all)."),
    host_limit: str = typer.Option("auto", help="How to emulate it: auto, affinity (pin) or quota (CFS)."),
    out: Path | None = typer.Option(None, "-o", "--out", help="Also write the JSON result to this file."),
    json_only: bool = typer.Option(False, "--json", help="Print only the JSON line."),
) -> None:
    """Episodes of built-in tasks (replay agent, fixed model time) on a busy host: where their time goes."""
    from sandrl.bench.episodes import EpisodesConfig, run

    config = EpisodesConfig(
        quick=quick,
        episodes=n,
        tasks=_names(tasks, "--tasks"),
        background=background,
        model_s=model_s,
        tokens_per_s=tokens_per_s,
        concurrency=concurrency,
        cores=cpus_per_host,
        host_limit=_host_limit(host_limit),
    )
    emit(asyncio.run(run(config, console=rich_console(quiet=json_only, wide=True))), out)


@app.command("admission")
def admission(
    quick: bool = typer.Option(False, "--quick", help="The small run (about 2 minutes on 2 cores)."),
    capacity: str | None = typer.Option(
        None, help="Host capacity: commands at once, or a `bench contention` result file (default: measure it)."
    ),
    factor: float = typer.Option(
        2.0, help="Offered load: factor x capacity busy sandboxes (episodes in flight: that / their busy share)."
    ),
    n: int | None = typer.Option(None, "--episodes", "-n", help="Episodes per way per round."),
    rounds: int | None = typer.Option(None, help="Rounds (each runs both ways, in alternating order)."),
    model_s: float = typer.Option(0.2, help="Emulated model seconds per turn."),
    workloads: str | None = typer.Option(None, help="Workloads each episode runs as its turns, comma-separated."),
    bar: float = typer.Option(1.5, help="Slowdown bar: time / standalone at most this."),
    quantile: float = typer.Option(0.95, help="Fraction of commands that must be within the bar."),
    cpus_per_host: float | None = typer.Option(None, help="Emulate a host of this many cores (default: all)."),
    host_limit: str = typer.Option("auto", help="How to emulate it: auto, affinity (pin) or quota (CFS)."),
    fill_idle_cores: float | None = typer.Option(
        None, help="Capacity-aware also runs a waiting command while this many cores sat idle (default: never)."
    ),
    out: Path | None = typer.Option(None, "-o", "--out", help="Also write the JSON result to this file."),
    json_only: bool = typer.Option(False, "--json", help="Print only the JSON line."),
) -> None:
    """At 2x the host's capacity: admitting every command against capacity-aware admission, side by side."""
    from sandrl.bench.admission import AdmissionConfig, run
    from sandrl.capacity import parse_capacity

    slots, source = parse_capacity(capacity)
    config = AdmissionConfig(
        quick=quick,
        capacity=slots,
        capacity_source=source,
        factor=factor,
        episodes=n,
        rounds=rounds,
        model_s=model_s,
        workloads=_names(workloads, "--workloads"),
        bar=bar,
        quantile=quantile,
        cores=cpus_per_host,
        host_limit=_host_limit(host_limit),
        fill_idle_cores=fill_idle_cores,
    )
    emit(asyncio.run(run(config, console=rich_console(quiet=json_only, wide=True))), out)


@app.command("study")
def study(
    quick: bool = typer.Option(False, "--quick", help="The small study (about 5 minutes on 2 cores)."),
    cpus_per_host: float | None = typer.Option(
        None, help="Host B's cores, emulated on this host (default: half of this host's, at least 1)."
    ),
    host_limit: str = typer.Option("auto", help="How to emulate host B: auto, affinity (pin) or quota (CFS)."),
    out_dir: Path = typer.Option(Path("study"), "-o", "--out-dir", help="Where the results and the report go."),
    seed: int = typer.Option(0, help="Seeds the background order, the episodes and the resampling."),
    json_only: bool = typer.Option(False, "--json", help="Print only the JSON line."),
) -> None:
    """The whole sandbox-CPU study on this host and an emulated smaller one: contention, episodes with the
    emulated model time, projection; both results, the comparison and the HTML report (within 15 minutes)."""
    from sandrl.bench.study import StudyConfig, run

    config = StudyConfig(
        quick=quick, cpus_per_host=cpus_per_host, host_limit=_host_limit(host_limit), out_dir=out_dir, seed=seed
    )
    emit(asyncio.run(run(config, console=rich_console(quiet=json_only, wide=True))))


@app.command("report")
def report(
    results: list[Path] = typer.Argument(..., help="Result files of `sandrl bench contention` or `episodes`."),
    output: Path = typer.Option(Path("report.html"), "-o", "--output", help="The HTML page to write."),
) -> None:
    """Render result files as one HTML page with the plots."""
    from sandrl.bench.report import write_report

    path = write_report(results, output)
    rich_console().print(f"wrote {path}")
    emit({"bench": "report", "output": str(path), "results": [str(p) for p in results]})


@app.command("compare")
def compare(
    a: Path = typer.Argument(..., help="Host A's result."),
    b: Path = typer.Argument(..., help="Host B's result."),
    json_only: bool = typer.Option(False, "--json", help="Print only the JSON line."),
) -> None:
    """Two hosts side by side: episode, commands, verifier, capacity, per-core slowdown, idle KV, projection."""
    from sandrl.bench.report import compare_files

    table, result = compare_files(a, b)
    if not json_only:
        rich_console(wide=True).print(table)
    emit(result)


# The inference side's benchmarks live in a module of their own.
app.command("inference")(bench_inference.bench_inference)
app.command("gateway")(bench_inference.bench_gateway)
