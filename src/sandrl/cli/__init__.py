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

from sandrl.cli import bench, images, tasks
from sandrl.errors import SandrlError

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Agentic RL post-training with fast sandboxes.")
sandbox_app = typer.Typer(no_args_is_help=True, help="Run commands in sandboxes.")
serve_app = typer.Typer(no_args_is_help=True, help="Servers: sandboxes, inference.")
app.add_typer(sandbox_app, name="sandbox")
app.add_typer(bench.app, name="bench")
app.add_typer(serve_app, name="serve")
app.add_typer(tasks.app, name="tasks")
app.add_typer(images.app, name="images")

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
    from sandrl.sandbox.server import serve

    serve(host, port, token_file=token_file, max_live=max_live, state_dir=state_dir)


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
