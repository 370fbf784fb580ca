"""``sandrl train CONFIG [--set section.key=value]... [--steps N] [--output-dir DIR] [--mode sync|async] ...``.

::

    sandrl train configs/tiny-learn.toml                # warm start, then RL: the reward rises
    sandrl train configs/tiny.toml                      # the [run] mode (sync by default)
    sandrl train configs/tiny.toml --mode async
    sandrl train configs/tiny.toml --steps 2 --output-dir /tmp/try --set train.lr=3e-5
    sandrl train configs/tiny.toml --rollout-only       # collect into rollouts.jsonl, no training
    sandrl train configs/tiny.toml --load-rollouts runs/tiny/rollouts.jsonl   # no sandboxes, no server
    sandrl train cluster.toml --ray auto                # on a Ray cluster: see sandrl.cluster.training

``--set`` changes any setting of the file, typed and checked as the file's own (see
:mod:`sandrl.train.overrides`); ``--steps`` and ``--output-dir`` are ``--set run.steps=`` and
``--set run.output_dir=``; ``--warm-start`` is ``--set warm_start.enabled=true``. The run writes
under ``[run] output_dir`` (relative to the working directory): ``config.toml`` (the resolved
config), ``metrics.jsonl`` (one line per step),
``rollouts.jsonl`` and ``checkpoints/``; started again, it resumes from the newest checkpoint (a
run whose steps are all done says so: raise ``--steps`` to train on). It prints a progress line
per step on stderr and ends with one JSON line on stdout (the last step's metrics); within a step,
a bar (a plain line every ``$SANDRL_PROGRESS_EVERY_S`` seconds when stderr is not a terminal) says
how many of its episodes finished, then what the trainer works on.

SIGINT (Ctrl-C) and SIGTERM stop it cleanly: the step in flight ends, a checkpoint holds every
step done, sandboxes and servers are closed, and one line says
``interrupted: 3/36 steps, checkpoint step-00000003 in DIR, rerun the same command to resume``;
the exit status is 130 or 143. A second signal stops at once.

``--ray`` is routed here rather than in :mod:`sandrl.train`: the cluster package builds on the
train package, so the train package must not import it back.
"""

from __future__ import annotations

from pathlib import Path

import typer

from sandrl.cli.output import emit, print_error
from sandrl.errors import ConfigError

# No name when mounted: `train` is a command of the root, not a group.
app = typer.Typer()


@app.command("train")
def train_cmd(
    config: Path = typer.Argument(..., help="The run's TOML config (see configs/tiny.toml)."),
    set_: list[str] = typer.Option(
        [],
        "--set",
        metavar="SECTION.KEY=VALUE",
        help="Change one setting of the config, e.g. --set train.lr=3e-5 --set train.loss.loss_type=grpo "
        "(repeatable; typed and checked as in the file).",
    ),
    steps: int | None = typer.Option(
        None, help="Train this many steps in all ([run] steps); a resumed run trains on up to it."
    ),
    output_dir: str | None = typer.Option(
        None, help="Where the run writes ([run] output_dir; relative to the working directory)."
    ),
    warm_start: bool = typer.Option(
        False,
        "--warm-start",
        help="First fine-tune the model on the tasks' reference solutions, then train RL from it "
        "([warm_start] enabled; made once, into OUTPUT_DIR/warm_start/).",
    ),
    mode: str | None = typer.Option(None, help="sync or async (default: [run] mode)."),
    load_rollouts: Path | None = typer.Option(None, help="Train on saved trajectories: no sandboxes, no inference."),
    rollout_only: bool = typer.Option(False, help="Collect rollouts without training."),
    ray: str | None = typer.Option(
        None, help="Run on a Ray cluster: 'auto' (the one started here) or its ADDRESS; needs a [cluster] section."
    ),
    nproc: int | None = typer.Option(
        None, "--nproc", metavar="N", help="Training processes (ranks), one per GPU ([train] processes)."
    ),
    plan: bool = typer.Option(
        False,
        "--plan",
        help="Print the trainer's memory per device (parameters, gradients, optimizer state, activations, "
        "log-prob buffers, reference) against the device's, and what to change if it does not fit; start nothing.",
    ),
    device_memory: str | None = typer.Option(
        None,
        "--device-memory",
        metavar="SIZE",
        help="One device's memory for the plan and the check before a run, e.g. 80GiB (default: what the device "
        "reports; on CPU the host's available memory). Needed to plan a GPU run on a machine without the GPU.",
    ),
) -> None:
    """Train a policy with GRPO in sandboxes; a progress line per step, then one JSON line."""
    overrides = [*set_]
    if steps is not None:
        overrides.append(f"run.steps={steps}")
    if output_dir is not None:
        overrides.append(f"run.output_dir={output_dir}")
    if warm_start:
        overrides.append("warm_start.enabled=true")
    if nproc is not None:
        overrides.append(f"train.processes={nproc}")
    if plan:
        from sandrl.cli.train_plan import plan_command

        plan_command(config, overrides, device_memory=device_memory, ray=ray)
        return
    if ray is not None:
        if load_rollouts is not None:
            raise ConfigError("--load-rollouts trains on saved trajectories in this process: drop --ray")
        from sandrl.cluster.training import train_on_ray

        emit(train_on_ray(config, ray, mode=mode, rollout_only=rollout_only, overrides=overrides))
        return
    from sandrl.train.run_config import load_run_config

    # A bad config is refused before the trainer's modules (PyTorch: seconds) load.
    run_config = load_run_config(config, overrides)
    from sandrl import interrupt
    from sandrl.train.command import run_training, saved_line
    from sandrl.train.plan import parse_size

    memory = parse_size(device_memory) if device_memory is not None else None
    try:
        result = interrupt.run(
            run_training(
                run_config,
                mode=mode,
                load_rollouts=load_rollouts,
                rollout_only=rollout_only,
                device_memory=memory,
            )
        )
    except interrupt.Interrupted as stop:
        print_error(saved_line(run_config, rollout_only=rollout_only), label="interrupted")
        raise typer.Exit(stop.exit_code) from None
    emit(result)
