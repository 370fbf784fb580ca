"""``sandrl eval TASKS``: an agent over tasks in sandboxes, each episode verified.

The summary, the per-task pass@k table, the failures grouped by why, and progress go to stderr;
the resolved config, the results and every trajectory to ``runs/eval/<UTC time>/`` (or
``--results-dir``). The command ends with one JSON line on stdout
(:func:`sandrl.wiring.evaluate.result_line`), and exits 1 when no episode could run at all (every
one an infra error), saying why. When stderr is not a terminal, the bar of episodes is a plain line
every ``$SANDRL_PROGRESS_EVERY_S`` seconds (done, rate, ETA, counts).

SIGINT (Ctrl-C) and SIGTERM stop it cleanly (:mod:`sandrl.interrupt`): the episodes in flight are
cancelled and their sandboxes closed, and one line says how many episodes finished and where their
trajectories are (``results.json`` is written only by an eval that finished); exit 130 or 143.
"""

from __future__ import annotations

from pathlib import Path

import typer

from sandrl.cli.output import SWEBENCH_IMAGES_HELP, emit, err_console, print_error, sandboxes_help

# No name when mounted: `eval` is a command of the root, not a group.
app = typer.Typer()


@app.command("eval")
def eval_tasks(
    tasks: str = typer.Argument(..., help="A task directory, a directory of them, a SWE-bench file, or 'builtin'."),
    agent: str | None = typer.Option(
        None,
        help="llm, oracle, null, replay, mini-swe-agent, terminus-2, claude-code, codex or module:function (see the "
        "README); "
        "default: the --config run's agent, else oracle.",
    ),
    inference: str | None = typer.Option(
        None,
        help="'embedded', an SGLang-routes server's URL (or several, joined by commas: one router keeps each "
        "episode on one of them) or vllm://HOST:PORT (agents with a model); default: the --config run's.",
    ),
    format: str | None = typer.Option(
        None, "--format", help="The llm agent's actions: 'fenced' bash blocks or 'tools' (default: [rollout]'s)."
    ),
    tool_parser: str | None = typer.Option(
        None, help="Tool-call parser: hermes, glm45, llama3_json (default: detected from the chat template)."
    ),
    model: str | None = typer.Option(
        None,
        help="'tiny' or a checkpoint dir (embedded: the model; URL: its tokenizer); "
        "default: the --config run's, else tiny.",
    ),
    samples: int = typer.Option(1, help="Episodes per task (a GRPO group)."),
    concurrency: int | None = typer.Option(None, help="Episodes at once (default: [rollout]'s, 8)."),
    out: Path | None = typer.Option(None, "--out", "--save-rollouts", help="Write every trajectory here (JSONL)."),
    max_turns: int | None = typer.Option(None, help="Turns per episode (default: [rollout]'s, 4)."),
    max_total_tokens: int | None = typer.Option(
        None, help="Tokens per episode, prompt included (default: [rollout]'s, 2048)."
    ),
    max_new_tokens: int | None = typer.Option(None, help="Tokens per model reply (default: [rollout]'s, 128)."),
    temperature: float | None = typer.Option(None, help="Sampling temperature (default: [rollout]'s, 1.0)."),
    run_id: str | None = typer.Option(None, help="Prefix of the episode ids; fixed = ids stable across runs."),
    host_capacity: str | None = typer.Option(
        None, help="Commands at once (the rest queue): a number, or a `sandrl bench contention` result file."
    ),
    swebench_images: str | None = typer.Option(None, help=SWEBENCH_IMAGES_HELP),
    fork_groups: bool | None = typer.Option(
        None, "--fork-groups", help="Set each task up once per group of --samples, and fork its episodes from it."
    ),
    sandboxes: str | None = typer.Option(None, help=sandboxes_help("[rollout]'s, local")),
    config: Path | None = typer.Option(
        None,
        "--config",
        help="A training run's config (its config.toml): evaluate as it trained (agent, format, system prompt, "
        "sampling, budgets, timeouts); the options given override it.",
    ),
    task: str | None = typer.Option(None, "--task", help="Only the tasks whose name matches this glob, e.g. 'fix-*'."),
    limit: int | None = typer.Option(None, help="At most N tasks: a sample drawn with --seed."),
    seed: int = typer.Option(0, help="Seeds the --limit sample, the embedded engine's sampling and the replay agent."),
    results_dir: Path | None = typer.Option(
        None, help="Where config.json, results.json and rollouts.jsonl go (default: runs/eval/<UTC time>/)."
    ),
) -> None:
    """Run an agent over tasks in sandboxes; print a summary, then one JSON line."""
    from sandrl import interrupt
    from sandrl.capacity import parse_capacity
    from sandrl.train.run_config import load_run_config
    from sandrl.wiring.evaluate import (
        EvalConfig,
        default_results_dir,
        evaluate,
        interrupted_line,
        nothing_ran,
        result_line,
        rollout_of,
    )

    run = load_run_config(config) if config is not None else None
    trained_with = rollout_of(run.rollout) if run is not None else None
    eval_config = EvalConfig(
        tasks,
        agent=agent or (trained_with.agent if trained_with is not None else "oracle"),
        inference=inference or (run.model.inference if run is not None else None),
        format=format,
        tool_parser=tool_parser,
        model=model or (run.model.name if run is not None else "tiny"),
        samples=samples,
        concurrency=concurrency,
        out=out,
        max_turns=max_turns,
        max_total_tokens=max_total_tokens,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        run_id=run_id,
        host_capacity=parse_capacity(host_capacity, "--host-capacity")[0],
        swebench_images=swebench_images,
        fork_groups=fork_groups,
        sandboxes=sandboxes,
        task_pattern=task,
        limit=limit,
        seed=seed,
        results_dir=results_dir if results_dir is not None else default_results_dir(),
        trained_with=trained_with,
        trained_model=run.model if run is not None else None,
    )
    err_console.print(
        f"view: sandrl view {eval_config.results_dir}  (its episodes, while it runs and after)",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    try:
        result = interrupt.run(evaluate(eval_config, console=err_console))
    except interrupt.Interrupted as stop:
        print_error(interrupted_line(eval_config), label="interrupted")
        raise typer.Exit(stop.exit_code) from None
    err_console.print(f"results: {eval_config.results_dir}", markup=False, highlight=False, soft_wrap=True)
    emit(result_line(eval_config, result))
    why = nothing_ran(result)
    if why is not None:
        print_error(why)
        raise typer.Exit(1)
