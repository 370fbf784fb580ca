"""``sandrl bench inference`` and ``sandrl bench gateway``: the inference side's benchmarks (registered as
commands by :mod:`sandrl.cli.bench`)."""

from __future__ import annotations

import dataclasses

import typer

from sandrl.cli.output import emit, err_console, rich_console
from sandrl.errors import ConfigError, SandrlError


def bench_inference(
    model: str = typer.Option("tiny", help="'tiny' or a local checkpoint dir."),
    concurrency: int = typer.Option(16, help="Concurrent requests (--update-policy: episodes generating at once)."),
    max_new_tokens: int = typer.Option(64, help="Tokens generated per request."),
    repeats: int = typer.Option(3, help="Repetitions; the median is reported."),
    update_policy: str | None = typer.Option(
        None,
        help="Instead of throughput: weight updates during async generation under in_place, pause, "
        "abort_and_resume, or all (the three, plus the abort reference row), on the tiny model.",
    ),
    duration_s: float | None = typer.Option(None, help="With --update-policy: seconds per policy (default 40)."),
    update_every_s: float | None = typer.Option(None, help="With --update-policy: seconds between updates (4)."),
    prefix_cache: bool = typer.Option(
        False,
        "--prefix-cache",
        help="Instead of throughput: the demo's episodes over 4 turns with the engine's prefix cache off and on "
        "(prompt tokens prefilled per episode, target <= 0.5x; generations identical).",
    ),
    quick: bool = typer.Option(False, "--quick", help="--update-policy, --prefix-cache, --fleet: a run of seconds."),
    seed: int = typer.Option(0, help="With --update-policy: seeds the episodes' lengths and prompts."),
    router: bool = typer.Option(
        False,
        "--router",
        help="Instead of throughput: what the fleet's router adds to a call, on 2 launched embedded engines "
        "(episodes of 4 turns through it against the same calls sent to their engine directly; target <= 1 ms).",
    ),
    fleet: bool = typer.Option(
        False,
        "--fleet",
        help="Instead of throughput: #40's targets on launched embedded engines: prefix-cache reuse with episode "
        "affinity vs round-robin, weight push by broadcast vs disk (104M), router overhead, prefix cache off vs on.",
    ),
    kv_admission: bool = typer.Option(
        False,
        "--kv-admission",
        help="Instead of throughput: a burst of multi-turn episodes on an engine with a small KV bound, with and "
        "without [inference] kv_admission (retractions, prefill tokens, episodes/hour, the wait).",
    ),
    json_only: bool = typer.Option(False, "--json", help="Print only the JSON line."),
) -> None:
    """Embedded engine throughput: N concurrent requests against one at a time; or, with --update-policy,
    what each weight-update policy costs async generation (episodes/hour, tokens discarded, update latency);
    or, with --prefix-cache, what the prefix cache saves multi-turn episodes; or, with --router, what the
    fleet's router adds to a call; or, with --fleet, all of inference at scale's targets."""
    if fleet:
        from sandrl.bench.fleet import run_with_card

        emit(run_with_card(quick=quick, seed=seed, console=rich_console(quiet=json_only, wide=True)))
        return
    if kv_admission:
        from sandrl.bench.kv_admission import QUICK, KVBenchConfig
        from sandrl.bench.kv_admission import run as run_kv

        emit(run_kv(QUICK if quick else KVBenchConfig(), rich_console(quiet=json_only)))
        return
    if router:
        from sandrl.bench.router import bench_router
        from sandrl.bench.router import render_card as router_card

        result = bench_router(model)
        if not json_only:
            err_console.print(router_card(result))
        emit(result)
        return
    if prefix_cache:
        from sandrl.bench.inference_prefix import PrefixBenchConfig, render_card, run

        result = run(dataclasses.replace(PrefixBenchConfig.quick() if quick else PrefixBenchConfig(), seed=seed))
        rich_console(quiet=json_only, wide=True).print(render_card(result), highlight=False)
        emit(result)
        return
    if update_policy is not None:
        _bench_updates(update_policy, concurrency, duration_s, update_every_s, quick, seed, json_only)
        return
    from sandrl.bench.inference import bench_engine, render_card

    if concurrency < 1 or max_new_tokens < 1 or repeats < 1:
        raise SandrlError("--concurrency, --max-new-tokens and --repeats must be at least 1")
    result = bench_engine(model, concurrency=concurrency, max_new_tokens=max_new_tokens, repeats=repeats)
    err_console.print(render_card(result))
    emit(result)


def bench_gateway(
    model: str = typer.Option("tiny", help="'tiny' or a local checkpoint dir."),
    sessions: int = typer.Option(256, help="Concurrent sessions."),
    turns: int = typer.Option(4, help="Chat turns per session."),
    max_tokens: int = typer.Option(4, help="Tokens per reply (few: the gateway's cost is measured)."),
    api: str = typer.Option(
        "chat", help="The route the sessions speak: chat (OpenAI chat completions), messages (Anthropic), responses."
    ),
    stream: bool = typer.Option(False, "--stream", help="Ask for streamed answers (server-sent events)."),
) -> None:
    """The session gateway's overhead per turn against the same turns sent to the engine directly."""
    from sandrl.bench.gateway import bench_gateway, render_card

    result = bench_gateway(model, sessions=sessions, turns=turns, max_tokens=max_tokens, api=api, stream=stream)
    err_console.print(render_card(result))
    emit(result)


def _bench_updates(
    policy: str,
    concurrency: int,
    duration_s: float | None,
    update_every_s: float | None,
    quick: bool,
    seed: int,
    json_only: bool,
) -> None:
    from sandrl.bench.inference_updates import UpdateBenchConfig, render_card, run
    from sandrl.inference.base import UPDATE_POLICIES

    if policy != "all" and policy not in UPDATE_POLICIES:
        raise ConfigError(f"--update-policy is one of {', '.join(UPDATE_POLICIES)} or all, not {policy!r}")
    base = UpdateBenchConfig.quick() if quick else UpdateBenchConfig(concurrency=concurrency)
    config = dataclasses.replace(
        base,
        policies=UPDATE_POLICIES if policy == "all" else (policy,),
        reference_abort=policy == "all",
        seed=seed,
        duration_s=base.duration_s if duration_s is None else duration_s,
        update_every_s=base.update_every_s if update_every_s is None else update_every_s,
    )
    console = rich_console(quiet=json_only, wide=True)
    result = run(config, progress=lambda line: console.print(line, highlight=False))
    console.print(render_card(result), highlight=False)
    emit(result)
