"""``sandrl demo`` (the main job end to end) and ``sandrl demo sandbox`` (one sandbox, shown)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import typer

from sandrl.cli.output import emit, rich_console, sandboxes_help

app = typer.Typer(help="The main job end to end on the embedded defaults.")


@app.callback(invoke_without_command=True)
def demo(
    ctx: typer.Context,
    out: Path = typer.Option(Path("runs/demo"), help="Where the run is written (emptied first)."),
    seed: int = typer.Option(0, help="Seeds the tasks, the model, the warm start and the RL run."),
    rl_steps: int | None = typer.Option(None, help="GRPO steps (default: the demo's, 80; --format tools: 180)."),
    family: str | None = typer.Option(None, help="The generated task family (default: the demo's, 'lines')."),
    format: str = typer.Option("fenced", "--format", help="The policy acts by 'fenced' bash blocks or 'tools' calls."),
    sandboxes: str | None = typer.Option(None, help=sandboxes_help("the demo's, local")),
) -> None:
    """Warm-start a tiny model, train it with GRPO in async mode on real sandboxes, show it learned."""
    if ctx.invoked_subcommand is not None:
        return
    from sandrl.demo.learn import TOOLS_RL_STEPS, DemoConfig, run, tools_rollout
    from sandrl.errors import ConfigError

    if format not in ("fenced", "tools"):
        raise ConfigError(f"--format must be 'fenced' or 'tools', got {format!r}")
    defaults = DemoConfig()
    rollout = tools_rollout(defaults.rollout) if format == "tools" else defaults.rollout
    config = DemoConfig(
        out=out,
        seed=seed,
        rl_steps=rl_steps if rl_steps is not None else TOOLS_RL_STEPS if format == "tools" else defaults.rl_steps,
        family=defaults.family if family is None else family,
        rollout=dataclasses.replace(rollout, sandboxes=sandboxes or rollout.sandboxes),
    )
    summary = asyncio.run(run(config))
    emit({k: summary[k] for k in ("improvement_points", "heldout_before", "heldout_after", "wall_s")})


@app.command("sandbox")
def demo_sandbox() -> None:
    """One sandbox: commands, files in and out, limits enforced, closed without a trace."""
    from sandrl.demo.sandbox import run_demo

    asyncio.run(run_demo(rich_console(stderr=False)))
