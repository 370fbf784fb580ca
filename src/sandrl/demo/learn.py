"""``sandrl demo``: a tiny policy learns a task family with GRPO, against real sandboxes and the real verifier.

1. **Tasks.** A generated family (``lines`` by default: "the file /workspace/input.txt holds
   a list of words; write its lines sorted / reversed / in upper case / ... into
   /workspace/answer.txt", one of eleven coreutils commands) in seeded sets: training tasks,
   held-out tasks, and demonstration and check tasks (for the warm start). Every task has a file
   of its own, so a held-out task is one the policy has never seen; what carries over is which
   command an instruction asks for. (With ``echo``, "write the word W", the tiny model learns each
   word by practising it and cannot copy one: RL then lifts only the words the warm start can
   already write, and its gain varied from +14 to +27 points by run; see ``docs/demo.md``.)
2. **Warm start.** The tiny model is built from a config and fine-tuned on demonstrations of a
   set of tasks of its own, by the run's ``[warm_start]`` as ``sandrl train --warm-start`` does it
   (:mod:`sandrl.train.warm_run`, :mod:`sandrl.train.warmstart`): a random model never writes a bash block,
   so without this every reward is 0 and GRPO has nothing to work with. It stops as soon as
   one sample at temperature 1 writes the reply of a third set of unseen demonstrations with
   probability 0.3 on average, checked every 5 steps (or after 600 steps): the policy then
   knows the format and is right often enough for groups to carry a signal, and sharpening it
   on what the verifier rewards is RL's job. Stopping there rather than at a fixed step starts
   RL from about the same pass rate on every seed (greedy decoding is no such measure: on
   ``lines`` it jumps from 30% to 90% of the checks within 10 steps). The demonstrations are not the RL training
   tasks: a policy that has memorised the replies of its training tasks gets high rewards on
   them for free, and RL then sharpens that memory instead of what carries over to the
   held-out tasks. Each check also
   reports the share of check demonstrations a group of ``group_size`` samples would write at
   least once: GRPO learns nothing from a task that no episode of its group solves.
3. **Before.** The warm-started policy attempts every held-out task ``heldout_samples`` times,
   sampled at the training temperature, in fresh sandboxes, scored by the task's verifier.
4. **RL.** ``sandrl train`` in async mode (:func:`sandrl.train.command.run_training`, the same
   code) from the warm start: the embedded engine samples, episodes run in sandboxes, the
   trainer steps while the next groups are being sampled, weights are pushed every step.
5. **After.** The held-out evaluation again, with the trained weights, same seeds.

It writes under ``out``: ``tasks/heldout/``, ``rl/`` (the run: config, its tasks, the warm
start's checkpoint and demonstrations in ``warm_start/``, metrics, rollouts, checkpoints),
``reward.png`` and ``demo.json`` (the numbers), and prints the reward curve in the terminal.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from sandrl.errors import ConfigError
from sandrl.inference.tiny_config import TinyModelConfig
from sandrl.rollout.jsonl import TrajectoryWriter
from sandrl.sandbox.base import SandboxProvider
from sandrl.tasks.builtin.generated import FAMILIES, generate_tasks
from sandrl.tasks.task import Task
from sandrl.train import checkpoint
from sandrl.train.command import run_training
from sandrl.train.config import TrainConfig
from sandrl.train.losses import LossConfig
from sandrl.train.run_config import AsyncSection, RolloutSection, RunConfig, RunSection, WarmStartSection
from sandrl.train.warm_run import warm_start_run
from sandrl.train.warm_start_config import WarmStartConfig
from sandrl.wiring import (
    ModelConfig,
    RolloutConfig,
    TasksConfig,
    build_runner,
    load_task_set,
    open_policy,
    open_provider,
)

HELDOUT_SEED_OFFSET = 1000
"""The held-out tasks are the family's of the demo's seed + this: none is trained on, or demonstrated."""

SYSTEM_PROMPT = "Solve the task in a Linux shell. Reply with one command in a ```bash block."
"""A short system prompt: the tiny model's every step reads it, and a long one would cost most of its compute."""

TOOLS_SYSTEM_PROMPT = "Solve the task in a Linux shell."
"""The ``--format tools`` demo's system prompt; the chat template adds the ``bash`` tool and the call format."""


TOOLS_RL_STEPS = 180
"""The ``--format tools`` demo's GRPO steps. Its replies carry a 44-byte JSON frame around the command
that the byte-level model must also get right at temperature 1, and its reward climbs more slowly
than the fenced demo's: after 80 steps it gained +12 to +17 held-out points on seeds 0-2, after
140 +19.5 to +24.6, one seed short of +20 (``docs/demo.md``)."""


def tools_rollout(rollout: RolloutConfig) -> RolloutConfig:
    """The demo's episodes with tool calls: the ``bash`` tool alone (the context is short), room for the call."""
    return replace(
        rollout,
        format="tools",
        tools="bash",
        system_prompt=TOOLS_SYSTEM_PROMPT,
        max_new_tokens=rollout.max_new_tokens + 64,  # <tool_call>{"name": "bash", "arguments": ...}</tool_call>
    )


@dataclass(frozen=True)
class DemoConfig:
    """The demo's settings; the defaults finish in a few minutes on 2 CPU cores."""

    out: Path = Path("runs/demo")
    seed: int = 0
    """Seeds the tasks, the model's initialisation, the warm start's order and the RL run."""
    family: str = "lines"
    """The generated task family (:data:`sandrl.tasks.builtin.generated.FAMILIES`)."""
    train_tasks: int = 256
    heldout_tasks: int = 64
    warm_tasks: int = 256
    """Tasks (of their own seed) whose demonstrations the warm start learns from."""
    check_tasks: int = 32
    """Tasks (of their own seed) whose demonstrations decide when the warm start has learned enough."""
    heldout_samples: int = 8
    """Episodes per held-out task: the pass rate is over ``heldout_tasks x heldout_samples`` episodes."""
    warm: WarmStartConfig = field(
        default_factory=lambda: WarmStartConfig(
            steps=600,
            stop_at_sampled=0.3,
            check_every=5,
            tiny=TinyModelConfig(hidden_size=128, num_layers=4, intermediate_size=256, max_position_embeddings=512),
        )
    )
    rl_steps: int = 80
    """On ``lines`` the training pass rate is near its plateau (about 0.8 at temperature 1) by
    step 60; 80 steps keep the demo near 8 minutes on 2 cores. (``echo`` needs 120: its words are
    learned one by one.)"""
    groups_per_step: int = 8
    rollout: RolloutConfig = field(
        default_factory=lambda: RolloutConfig(
            group_size=8, concurrency=32, max_turns=1, max_new_tokens=80, system_prompt=SYSTEM_PROMPT
        )
    )
    """The episodes of the RL run and of the held-out evaluations (with ``heldout_samples`` per task):
    one turn, short replies, the short system prompt; the token budget is the model's context."""
    lr: float = 3e-4
    warmup_steps: int = 5
    """Adam's first updates are sign-sized on every weight: ramping the rate up keeps them from
    undoing the warm start."""
    lr_decay: bool = True
    """Anneal the rate to a tenth of ``lr`` by the last step (cosine): with a constant rate the
    policy's reward stops rising half way through and drifts."""

    def __post_init__(self) -> None:
        counts = {
            "train_tasks": self.train_tasks,
            "heldout_tasks": self.heldout_tasks,
            "warm_tasks": self.warm_tasks,
            "heldout_samples": self.heldout_samples,
            "check_tasks": self.check_tasks,
            "rl_steps": self.rl_steps,
            "groups_per_step": self.groups_per_step,
        }
        bad = {k: v for k, v in counts.items() if v < 1}
        if bad:
            raise ConfigError(f"demo settings must be at least 1, got {bad}")
        if self.rollout.group_size < 2:
            raise ConfigError("group_size must be at least 2: GRPO compares the episodes of a group")
        if self.family not in FAMILIES:
            raise ConfigError(f"no task family {self.family!r}; choose one of {', '.join(FAMILIES)}")

    def seeded_warm_start(self) -> WarmStartConfig:
        """The warm start with the demo's seed on the model's initialisation and the demonstrations' order."""
        return replace(
            self.warm, seed=self.seed, group_size=self.rollout.group_size, tiny=replace(self.warm.tiny, seed=self.seed)
        )

    def episodes(self) -> RolloutConfig:
        """:attr:`rollout` with the token budget of the tiny model's context."""
        return replace(self.rollout, max_total_tokens=self.warm.tiny.max_position_embeddings)


def rl_config(cfg: DemoConfig) -> RunConfig:
    """The ``sandrl train`` config of the warm start and the RL phase (saved resolved as ``rl/config.toml``).

    Its tasks are the family's of the demo's seed, the warm start's demonstrations and checks those of
    seeds of their own (:data:`~sandrl.train.warm_run.DEMONSTRATION_SEED_OFFSET`); the held-out tasks'
    seed is apart from all three (:data:`HELDOUT_SEED_OFFSET`)."""
    return RunConfig(
        run=RunSection(
            output_dir=str(cfg.out / "rl"),
            mode="async",
            steps=cfg.rl_steps,
            groups_per_step=cfg.groups_per_step,
            seed=cfg.seed,
            resume=False,
        ),
        model=ModelConfig(name="tiny", inference="embedded"),
        tasks=TasksConfig(family=cfg.family, count=cfg.train_tasks, seed=cfg.seed),
        rollout=RolloutSection.of(cfg.episodes()),
        async_=AsyncSection(max_staleness=1, on_stale="drop", update_interval=1),
        train=TrainConfig(
            lr=cfg.lr,
            warmup_steps=cfg.warmup_steps,
            decay_steps=max(cfg.rl_steps - cfg.warmup_steps, 1) if cfg.lr_decay else 0,
            min_lr_ratio=0.1,
            # A micro-batch's activations are the driver's peak: 16384 tokens of this model held ~900 MiB in
            # the step (the demo peaked at 2.4-2.8 GB); 4096 hold ~300 MiB, as fast, same loss (the step's
            # token weights are fixed over its whole batch, whatever its split into micro-batches).
            micro_batch_tokens=4096,
            packing=False,  # padded rows: the tiny model attends over a packed row's whole length
            loss=LossConfig(loss_type="dapo"),
        ),
        warm_start=WarmStartSection.of(
            cfg.seeded_warm_start(), enabled=True, demonstrations=cfg.warm_tasks, checks=cfg.check_tasks
        ),
    )


def heldout_tasks(cfg: DemoConfig) -> list[Task]:
    """The held-out tasks, written (again) under ``out/tasks/heldout``: the family's of ``seed`` + an offset."""
    where = cfg.out / "tasks" / "heldout"
    shutil.rmtree(where, ignore_errors=True)  # a set of another size, written before
    generate_tasks(where, cfg.family, cfg.heldout_tasks, cfg.seed + HELDOUT_SEED_OFFSET)
    return load_task_set(str(where))


async def heldout_pass_rate(
    cfg: DemoConfig, model: Path, tasks: Sequence[Task], provider: SandboxProvider | None, label: str
) -> dict[str, Any]:
    """The pass rate of the policy at ``model`` on ``tasks``, sampled as in training, in real sandboxes."""
    rollout = replace(cfg.episodes(), group_size=cfg.heldout_samples)
    async with open_policy(ModelConfig(name=str(model))) as policy, contextlib.AsyncExitStack() as stack:
        if provider is None:
            provider = await stack.enter_async_context(open_provider(rollout))
        writer = TrajectoryWriter(cfg.out / f"heldout-{label}.jsonl")
        runner = build_runner(
            rollout,
            provider,
            policy=policy,
            run_id=f"demo-{label}",
            writer=writer,
        )
        try:
            result = await runner.run(tasks, progress=True)
        finally:
            writer.close()
    episodes = result.trajectories
    passed = sum(bool(t.passed) for t in episodes)
    return {
        "pass_rate": passed / max(len(episodes), 1),
        "passed": passed,
        "episodes": len(episodes),
        "infra_errors": sum(t.status == "infra_error" for t in episodes),
        "wall_s": result.wall_s,
    }


def terminal_curve(values: Sequence[float], *, width: int = 60, height: int = 8) -> str:
    """``values`` (in [0, 1]) as a block chart: one column per step (bucketed to ``width``)."""
    if not values:
        return "(no steps)"
    buckets = [
        values[i * len(values) // min(width, len(values)) : (i + 1) * len(values) // min(width, len(values))]
        for i in range(min(width, len(values)))
    ]
    means = [sum(b) / len(b) for b in buckets]
    rows = []
    for level in range(height, 0, -1):
        cut = (level - 0.5) / height
        label = f"{level / height:4.2f} |" if level in (height, height // 2) else "     |"
        rows.append(label + "".join("█" if m >= cut else " " for m in means))
    rows.append("     +" + "-" * len(means))
    rows.append(f"      step 1{' ' * max(len(means) - 8, 1)}{len(values)}")
    return "\n".join(rows)


def reward_png(steps: Sequence[dict[str, Any]], before: float, after: float, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    xs = [m["step"] for m in steps]
    ax.plot(xs, [m["reward_mean"] for m in steps], marker="o", ms=3, label="training reward (mean per step)")
    passes = [m["pass_rate"] for m in steps]
    if passes != [m["reward_mean"] for m in steps]:
        # A family with partial credit: the pass rate is what the held-out lines count.
        ax.plot(xs, passes, lw=1, alpha=0.7, label="training pass rate")
    ax.axhline(before, color="grey", ls="--", label=f"held-out pass rate, warm start ({before:.0%})")
    ax.axhline(after, color="green", ls="--", label=f"held-out pass rate, after RL ({after:.0%})")
    ax.set_xlabel("GRPO step (async)")
    ax.set_ylabel("reward / pass rate")
    ax.set_ylim(0, 1.02)
    ax.set_title("sandrl demo: tiny model, real sandboxes, real verifier")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


async def run(
    cfg: DemoConfig, *, console: Console | None = None, provider: SandboxProvider | None = None
) -> dict[str, Any]:
    """The whole demo; the numbers it ends with (also written to ``out/demo.json``)."""
    con = console or Console(stderr=True)
    started = time.monotonic()
    if cfg.out.exists():
        shutil.rmtree(cfg.out)  # a demo always starts from nothing: same seeds, same numbers
    con.rule("[bold]sandrl demo: GRPO on real sandboxes")
    heldout = heldout_tasks(cfg)
    con.print(f"tasks: {cfg.train_tasks} training and {len(heldout)} held-out of the '{cfg.family}' family")
    con.print(f"  e.g. {heldout[0].instruction.strip()}")

    rl, ws = warm_start_run(rl_config(cfg), console=con)
    assert ws is not None, "the demo's run config warm-starts"

    before = await heldout_pass_rate(cfg, ws.path, heldout, provider, "before")
    con.print(f"held-out before RL: {before['pass_rate']:.1%} ({before['passed']}/{before['episodes']} episodes)")

    t = time.monotonic()
    await run_training(rl, mode="async", provider=provider, console=con)
    rl_s = time.monotonic() - t
    steps = [json.loads(line) for line in (rl.output_dir / "metrics.jsonl").read_text().splitlines()]
    final = checkpoint.latest(rl.output_dir / "checkpoints")
    assert final is not None, "the RL run saves a checkpoint at its end"
    after = await heldout_pass_rate(cfg, final / "model", heldout, provider, "after")

    rewards = [float(m["reward_mean"]) for m in steps]
    png = reward_png(steps, before["pass_rate"], after["pass_rate"], cfg.out / "reward.png")
    con.print("\ntraining reward per step")
    con.print(terminal_curve(rewards), highlight=False)
    table = Table(title="held-out pass rate (same tasks, same sampling)")
    for column in ("", "warm start", "after RL", "change"):
        table.add_column(column, justify="right")
    delta = after["pass_rate"] - before["pass_rate"]
    table.add_row("pass rate", f"{before['pass_rate']:.1%}", f"{after['pass_rate']:.1%}", f"{delta * 100:+.1f} points")
    con.print(table)
    summary = {
        "family": cfg.family,
        "seed": cfg.seed,
        "heldout_before": before,
        "heldout_after": after,
        "improvement_points": round(delta * 100, 2),
        "warmstart": {
            "steps": ws.steps,
            "loss_first": ws.loss_first,
            "loss_last": ws.loss_last,
            "greedy": ws.greedy,
            "coverage": ws.coverage,
            "sampled": ws.sampled,
            "wall_s": ws.wall_s,
        },
        "rl": {
            "steps": len(steps),
            "mode": "async",
            "reward_first": rewards[0] if rewards else None,
            "reward_last": rewards[-1] if rewards else None,
            "episodes": steps[-1]["total_episodes"] if steps else 0,
            "infra_errors": steps[-1]["total_infra_errors"] if steps else 0,
            "wall_s": rl_s,
        },
        "reward_png": str(png),
        "wall_s": time.monotonic() - started,
        "config": json.loads(json.dumps(asdict(cfg), default=str)),
    }
    (cfg.out / "demo.json").write_text(json.dumps(summary, indent=2) + "\n")
    con.print(f"reward curve: {png}   numbers: {cfg.out / 'demo.json'}   total {summary['wall_s']:.0f} s")
    con.print(f"read every episode, turn by turn: sandrl view {rl.output_dir}", highlight=False)
    return summary
