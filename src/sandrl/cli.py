"""The ``sandrl`` command.

Thin: each sub-command parses its arguments and calls the component that does the work.
Errors sandrl raises on purpose (:class:`sandrl.errors.SandrlError`) are printed as one
line that says what to do, never as a traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.console import Console

from sandrl.errors import SandrlError
from sandrl.tasks.cli import images_app, tasks_app

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Agentic RL post-training with fast sandboxes.")
sandbox_app = typer.Typer(no_args_is_help=True, help="Run commands in sandboxes.")
bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks; each ends with one JSON line.")
serve_app = typer.Typer(no_args_is_help=True, help="Servers: sandboxes, inference.")
app.add_typer(sandbox_app, name="sandbox")
app.add_typer(bench_app, name="bench")
app.add_typer(serve_app, name="serve")
app.add_typer(tasks_app, name="tasks")
app.add_typer(images_app, name="images")

err_console = Console(stderr=True)


demo_app = typer.Typer(help="The main job end to end on the embedded defaults.")
app.add_typer(demo_app, name="demo")


@demo_app.callback(invoke_without_command=True)
def demo(
    ctx: typer.Context,
    out: Path = typer.Option(Path("runs/demo"), help="Where the run is written (emptied first)."),
    seed: int = typer.Option(0, help="Seeds the tasks, the model, the warm start and the RL run."),
    rl_steps: int | None = typer.Option(None, help="GRPO steps (default: the demo's)."),
    family: str | None = typer.Option(None, help="The generated task family (default: the demo's, 'lines')."),
) -> None:
    """Warm-start a tiny model, train it with GRPO in async mode on real sandboxes, show it learned."""
    if ctx.invoked_subcommand is not None:
        return
    from sandrl.demo.learn import DemoConfig
    from sandrl.demo.learn import main as learn_main

    defaults = DemoConfig()
    learn_main(
        DemoConfig(
            out=out,
            seed=seed,
            rl_steps=defaults.rl_steps if rl_steps is None else rl_steps,
            family=defaults.family if family is None else family,
        )
    )


@demo_app.command("sandbox")
def demo_sandbox() -> None:
    """One sandbox: commands, files in and out, limits enforced, closed without a trace."""
    from sandrl.demo.sandbox import main as sandbox_main

    sandbox_main()


@sandbox_app.command(
    "run", context_settings={"allow_extra_args": True, "ignore_unknown_options": False}, no_args_is_help=True
)
def sandbox_run(
    command: list[str] = typer.Argument(..., help="The command and its arguments (after --)."),
    image: str = typer.Option("host", help="Image to start from."),
    cpus: float = typer.Option(1.0, help="CPU quota in cores."),
    memory_mb: int = typer.Option(2048, help="Memory limit in MiB."),
    pids: int = typer.Option(512, help="Most processes at once."),
    disk_mb: int = typer.Option(4096, help="Size of the writable layer in MiB."),
    timeout: float = typer.Option(60.0, help="Wall-clock limit in seconds; exit code 124 when hit."),
    network: bool = typer.Option(False, "--network", help="Share the host's network (default: loopback only)."),
    server: str | None = typer.Option(None, help="A sandbox service URL (default $SANDRL_SERVER; none: local)."),
    token_file: str | None = typer.Option(None, help="File holding the service's token (default $SANDRL_TOKEN)."),
) -> None:
    """Run COMMAND in a fresh sandbox, print its output, exit with its exit code."""
    import asyncio
    import os
    import shlex

    from sandrl.sandbox.base import SandboxSpec
    from sandrl.sandbox.bwrap import BwrapProvider

    if timeout <= 0:
        raise SandrlError("--timeout must be a positive number of seconds")
    spec = SandboxSpec(
        image=image,
        cpus=cpus,
        memory_mb=memory_mb,
        pids=pids,
        disk_mb=disk_mb,
        network=network,
        ttl_s=timeout + 60,
    )
    server = server or os.environ.get("SANDRL_SERVER")
    if server:
        from sandrl.sandbox.client import run_command

        raise typer.Exit(run_command(server, shlex.join(command), spec, timeout_s=timeout, token_file=token_file))

    async def go() -> int:
        provider = BwrapProvider()
        async with await provider.create(spec) as sandbox:
            result = await sandbox.exec(shlex.join(command), timeout_s=timeout)
        sys.stdout.write(result.stdout)
        sys.stderr.write(result.stderr)
        if result.timed_out:
            err_console.print(f"[bold red]timed out[/] after {timeout:g} s")
        if result.truncated:
            err_console.print("[yellow]output truncated[/] at the output cap")
        return result.exit_code

    code = asyncio.run(go())
    raise typer.Exit(code if code >= 0 else 128 - code)


def _labels(items: list[str]) -> dict[str, str]:
    labels = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SandrlError(f"--metadata takes KEY=VALUE, got {item!r}")
        labels[key] = value
    return labels


@sandbox_app.command("ls")
def sandbox_ls(
    server: str | None = typer.Option(None, help="The sandbox service URL (default $SANDRL_SERVER)."),
    metadata: list[str] = typer.Option([], help="Only sandboxes with this KEY=VALUE label (repeatable)."),
    token_file: str | None = typer.Option(None, help="File holding the service's token (default $SANDRL_TOKEN)."),
    json_out: bool = typer.Option(False, "--json", help="One JSON object per line."),
) -> None:
    """List the live sandboxes on a sandbox service."""
    import json

    from sandrl.sandbox.client import format_list, list_command

    rows = list_command(server, _labels(metadata), token_file=token_file)
    if json_out:
        for row in rows:
            print(json.dumps(row.model_dump()))
    else:
        print(format_list(rows))


@sandbox_app.command("rm")
def sandbox_rm(
    ids: list[str] = typer.Argument(None, help="Sandbox ids to close."),
    server: str | None = typer.Option(None, help="The sandbox service URL (default $SANDRL_SERVER)."),
    all_: bool = typer.Option(False, "--all", help="Close every sandbox (with --metadata: every matching one)."),
    metadata: list[str] = typer.Option([], help="With --all: only sandboxes with this KEY=VALUE label."),
    token_file: str | None = typer.Option(None, help="File holding the service's token (default $SANDRL_TOKEN)."),
) -> None:
    """Close sandboxes on a sandbox service."""
    from sandrl.sandbox.client import remove_command

    if not ids and not all_:
        raise SandrlError("give sandbox ids to close, or --all")
    closed = remove_command(server, ids or [], all_matching=_labels(metadata) if all_ else None, token_file=token_file)
    print(f"closed {len(closed)} sandbox(es)")


@serve_app.command("sandboxes")
def serve_sandboxes(
    host: str = typer.Option("127.0.0.1", help="Address to bind (without a token: loopback only)."),
    port: int = typer.Option(8700, help="Port to bind."),
    token_file: str | None = typer.Option(None, help="File holding the bearer token (or set $SANDRL_TOKEN)."),
    max_live: int | None = typer.Option(None, help="Most live sandboxes; further creates get capacity_exhausted."),
    state_dir: str | None = typer.Option(None, help="State directory (default /var/lib/sandrl)."),
) -> None:
    """Serve sandboxes over HTTP: the native /v1 API, Prometheus /metrics."""
    from sandrl.sandbox.service.server import serve

    serve(host, port, token_file=token_file, max_live=max_live, state_dir=state_dir)


@bench_app.command("service")
def bench_service(
    concurrency: list[int] = typer.Option([], help="Concurrent clients (repeatable; default 1, 16, 64, 256)."),
    n_exec: int = typer.Option(300, help="Execs for the one-client round-trip measure."),
    json_only: bool = typer.Option(False, "--json", help="Print only the JSON line."),
) -> None:
    """The sandbox service over HTTP beside the in-process provider."""
    import asyncio
    import io
    import json

    from sandrl.bench.service import LEVELS, run

    if any(c < 1 for c in concurrency) or n_exec < 1:
        raise SandrlError("--concurrency and --n-exec must be at least 1")
    console = Console(file=io.StringIO()) if json_only else Console(stderr=True)
    result = asyncio.run(run(concurrency=tuple(concurrency) or LEVELS, n_exec=n_exec, console=console))
    print(json.dumps(result))


@app.command("eval")
def eval_tasks(
    tasks: str = typer.Argument(..., help="A task directory, a directory of them, a SWE-bench file, or 'builtin'."),
    agent: str = typer.Option("oracle", help="llm, oracle, null or replay."),
    inference: str | None = typer.Option(None, help="'embedded' or the URL of an SGLang-routes server (--agent llm)."),
    model: str = typer.Option("tiny", help="'tiny' or a checkpoint dir (embedded: the model; URL: its tokenizer)."),
    samples: int = typer.Option(1, help="Episodes per task (a GRPO group)."),
    concurrency: int = typer.Option(8, help="Episodes at once."),
    out: Path | None = typer.Option(None, "--out", "--save-rollouts", help="Write every trajectory here (JSONL)."),
    max_turns: int = typer.Option(20, help="Turns per episode."),
    max_total_tokens: int = typer.Option(8192, help="Tokens per episode, prompt included."),
    max_new_tokens: int = typer.Option(512, help="Tokens per model reply."),
    temperature: float = typer.Option(1.0, help="Sampling temperature."),
    run_id: str | None = typer.Option(None, help="Prefix of the episode ids; fixed = ids stable across runs."),
    host_capacity: str | None = typer.Option(
        None, help="Commands at once (the rest queue): a number, or a `sandrl bench contention` result file."
    ),
) -> None:
    """Run an agent over tasks in sandboxes; print a summary, then one JSON line."""
    import asyncio
    import json

    from sandrl.bench.capacity import parse_capacity
    from sandrl.rollout.evaluate import EvalConfig, evaluate, result_line

    config = EvalConfig(
        tasks,
        agent=agent,  # type: ignore[arg-type]
        inference=inference,
        model=model,
        samples=samples,
        concurrency=concurrency,
        out=out,
        max_turns=max_turns,
        max_total_tokens=max_total_tokens,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        run_id=run_id,
        host_capacity=parse_capacity(host_capacity, "--host-capacity")[0],
    )
    result = asyncio.run(evaluate(config, console=err_console))
    print(json.dumps(result_line(config, result)))


@app.command("train")
def train_cmd(
    config: Path = typer.Argument(..., help="The run's TOML config (see configs/tiny.toml)."),
    mode: str | None = typer.Option(None, help="sync or async (default: [run] mode)."),
    load_rollouts: Path | None = typer.Option(None, help="Train on saved trajectories: no sandboxes, no inference."),
    rollout_only: bool = typer.Option(False, help="Collect rollouts without training."),
    ray: str | None = typer.Option(
        None, help="Run on a Ray cluster: 'auto' (the one started here) or its ADDRESS; needs a [cluster] section."
    ),
) -> None:
    """Train a policy with GRPO in sandboxes; a progress line per step, then one JSON line."""
    from sandrl.train.command import train

    train(config, mode, load_rollouts, rollout_only, ray)


@bench_app.command("rollout")
def bench_rollout(
    episodes: int = typer.Option(256, help="Episodes in all."),
    concurrency: int = typer.Option(256, help="Episodes at once."),
    suite: str = typer.Option("generated", help="'generated' or 'builtin'."),
    think_min_s: float = typer.Option(1.0, help="Shortest emulated model time per turn."),
    think_max_s: float = typer.Option(2.0, help="Longest emulated model time per turn."),
    json_only: bool = typer.Option(False, "--json", help="Print only the JSON line."),
) -> None:
    """Concurrent replay episodes with the model's time fixed: infra errors and orchestrator overhead."""
    import asyncio
    import io
    import json

    from sandrl.bench.rollout import run

    if suite not in ("generated", "builtin"):
        raise SandrlError("--suite must be 'generated' or 'builtin'")
    if episodes < 1 or concurrency < 1 or not 0 < think_min_s <= think_max_s:
        raise SandrlError("--episodes and --concurrency must be at least 1, and 0 < --think-min-s <= --think-max-s")
    console = Console(file=io.StringIO()) if json_only else Console(stderr=True)
    result = asyncio.run(
        run(
            episodes,
            concurrency,
            suite=suite,  # type: ignore[arg-type]
            think_s=(think_min_s, think_max_s),
            progress=not json_only,
            console=console,
        )
    )
    print(json.dumps(result))


@bench_app.command("train")
def bench_train(
    quick: bool = typer.Option(False, "--quick", help="A smoke run of seconds: the result's shape, not its ratio."),
    steps: int | None = typer.Option(None, help="Training steps in each mode (default 10)."),
    max_staleness: int | None = typer.Option(None, help="The async driver's staleness bound (default 2)."),
    on_stale: str | None = typer.Option(None, help="drop or regenerate a too-stale group (default drop)."),
    median_s: float | None = typer.Option(None, help="Median command time in seconds (default 0.8)."),
    sigma: float | None = typer.Option(None, help="Lognormal sigma of command times: the tail (default 1.2)."),
    seed: int = typer.Option(0, help="Seeds the tasks, their order and the command times."),
    json_only: bool = typer.Option(False, "--json", help="Print only the JSON line."),
) -> None:
    """Async vs sync training on a long tail of command times: episodes per hour, same tasks, model and budget."""
    import asyncio
    import io
    import json

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
    console = Console(file=io.StringIO()) if json_only else Console(stderr=True)
    print(json.dumps(asyncio.run(run(settings, console=console))))


@bench_app.command("sandbox")
def bench_sandbox(
    n: int = typer.Option(200, help="Repetitions of each latency measure."),
    live: int = typer.Option(500, help="Idle sandboxes live at once for the memory measure."),
    pool_size: int = typer.Option(8, help="Warm pool size."),
    json_only: bool = typer.Option(False, "--json", help="Print only the JSON line."),
) -> None:
    """Sandbox start-up, exec latency and idle footprint against plain subprocess and bare bwrap."""
    import asyncio
    import io
    import json

    from sandrl.bench.sandbox import run

    if n < 1 or live < 1 or pool_size < 1:
        raise SandrlError("--n, --live and --pool-size must be at least 1")
    console = Console(file=io.StringIO()) if json_only else Console(stderr=True)
    result = asyncio.run(run(n=n, live=live, pool_size=pool_size, console=console))
    print(json.dumps(result))


@serve_app.command("inference")
def serve_inference(
    model: str = typer.Option("tiny", help="'tiny' (built from a config) or a local Hugging Face checkpoint dir."),
    host: str = typer.Option("127.0.0.1", help="Address to bind."),
    port: int = typer.Option(30000, help="Port to bind."),
    max_batch_size: int = typer.Option(64, help="Most requests decoded together."),
    seed: int = typer.Option(0, help="Seed of the tiny model's weights and of sampling."),
) -> None:
    """Serve the embedded CPU engine with SGLang's and OpenAI's routes."""
    from sandrl.inference.engine import EngineConfig
    from sandrl.inference.server import serve

    serve(model, host, port, engine_config=EngineConfig(max_batch_size=max_batch_size, seed=seed))


@bench_app.command("inference")
def bench_inference(
    model: str = typer.Option("tiny", help="'tiny' or a local checkpoint dir."),
    concurrency: int = typer.Option(16, help="Concurrent requests, compared with one at a time."),
    max_new_tokens: int = typer.Option(64, help="Tokens generated per request."),
    repeats: int = typer.Option(3, help="Repetitions; the median is reported."),
) -> None:
    """Embedded engine throughput: N concurrent requests against one at a time."""
    import json

    from sandrl.inference.bench import bench_engine, render_card

    if concurrency < 1 or max_new_tokens < 1 or repeats < 1:
        raise SandrlError("--concurrency, --max-new-tokens and --repeats must be at least 1")
    result = bench_engine(model, concurrency=concurrency, max_new_tokens=max_new_tokens, repeats=repeats)
    err_console.print(render_card(result))
    print(json.dumps(result))


@bench_app.command("cluster")
def bench_cluster(
    episodes: int = typer.Option(32, help="Episodes on each side (groups of 2)."),
    concurrency: int = typer.Option(16, help="Episodes at once on each side (on Ray: split over 2 workers)."),
    think_s: float = typer.Option(2.0, help="Emulated model time per turn (3 turns an episode)."),
    ray: str | None = typer.Option(None, help="A Ray cluster to use (auto or ADDRESS); default: start one here."),
    json_only: bool = typer.Option(False, "--json", help="Print only the JSON line."),
) -> None:
    """The same episodes in process and on Ray with two sandbox hosts: orchestration overhead per episode."""
    import asyncio
    import io
    import json

    from sandrl.cluster.bench import run

    console = Console(file=io.StringIO()) if json_only else Console(stderr=True)
    result = asyncio.run(run(episodes=episodes, concurrency=concurrency, think_s=think_s, address=ray, console=console))
    print(json.dumps(result))


def _register_cpu_bench() -> None:
    from sandrl.bench import commands as cpu_bench

    bench_app.command("contention")(cpu_bench.contention)
    bench_app.command("episodes")(cpu_bench.episodes)
    bench_app.command("admission")(cpu_bench.admission)
    bench_app.command("report")(cpu_bench.report)
    bench_app.command("compare")(cpu_bench.compare)


_register_cpu_bench()


def main() -> None:
    """Entry point of the console script."""
    try:
        app()
    except SandrlError as exc:
        err_console.print(f"[bold red]error[/]: {exc.message}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except KeyboardInterrupt:
        err_console.print("[bold red]interrupted[/]")
        sys.exit(130)


if __name__ == "__main__":
    main()
