"""Supervised warm start: teach a policy the agent's format from the tasks' reference solutions.

A randomly initialised policy never writes a fenced bash block, so every episode scores 0 and
GRPO has no signal. The warm start fine-tunes it on *demonstrations*: for each task with a
reference solution, the agent's exact prompt (system prompt, instruction, assistant prefix)
followed by the solution's commands as one ```bash block and the end of the turn. The loss is
the masked cross-entropy of :meth:`~sandrl.train.trainer.Trainer.sft_step` on the reply only.

The demonstration is the one-turn transcript the :class:`~sandrl.rollout.agents.scripted.OracleAgent`
would produce if it typed its solution into the shell instead of uploading the script; its
tokens are built by the same :class:`~sandrl.inference.chat.ChatFormat` the LLM agent uses, so
what the policy learns to continue is byte for byte what it is shown in an episode.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandrl.errors import ConfigError, TaskError
from sandrl.inference.chat import ChatFormat
from sandrl.inference.model import build_tiny_model, load_model, save_weights
from sandrl.inference.tiny_config import TinyModelConfig
from sandrl.inference.tokenizer import TINY, Tokenizer
from sandrl.rollout.agents.formats import ActionFormat, AgentFormat, make_format
from sandrl.tasks.task import Task
from sandrl.train.batch import TrainSample
from sandrl.train.config import TrainConfig
from sandrl.train.trainer import Metrics, Trainer
from sandrl.train.warm_start_config import WarmStartConfig

_PREAMBLE = ("#!", "set -e", "set -u", "set -o", "set -euo")


def solution_command(task: Task) -> str:
    """The commands of ``task``'s reference solution, without its shebang and ``set -e...`` preamble."""
    script = task.solution.script if task.solution is not None else None
    if script is None or not script.is_file():
        raise TaskError(f"task {task.id} has no reference solution script to demonstrate; give it a solution/solve.sh")
    lines = script.read_text(encoding="utf-8").splitlines()
    while lines and (not lines[0].strip() or lines[0].lstrip().startswith(_PREAMBLE)):
        lines.pop(0)
    body = "\n".join(lines).strip()
    if not body:
        raise TaskError(f"task {task.id}: its solution script has no commands after the preamble")
    return body


def demonstration(task: Task, chat: ChatFormat, action_format: ActionFormat) -> TrainSample:
    """The one-turn episode that solves ``task``: prompt (mask 0), then the solution in the format (mask 1):
    a bash block, or a ``bash`` tool call as the chat template renders one."""
    prompt = chat.prompt_ids(
        [{"role": "system", "content": action_format.system_prompt}, {"role": "user", "content": task.instruction}]
    )
    reply = chat.reply_ids(action_format.demonstration(solution_command(task)))
    return TrainSample(
        token_ids=(*prompt, *reply),
        loss_mask=(0,) * len(prompt) + (1,) * len(reply),
        group_id=task.id,
        episode_id=f"demo/{task.id}",
    )


def batches(samples: Sequence[TrainSample], batch_size: int, steps: int, seed: int) -> list[list[TrainSample]]:
    """``steps`` batches of ``samples``: seeded shuffles, each sample once per pass."""
    if not samples:
        raise ConfigError("the warm start needs at least one demonstration")
    rng = random.Random(f"sandrl.warmstart:{seed}")
    order: list[int] = []
    out = []
    for _ in range(steps):
        batch: list[TrainSample] = []
        while len(batch) < min(batch_size, len(samples)):
            if not order:
                order = list(range(len(samples)))
                rng.shuffle(order)
            batch.append(samples[order.pop()])
        out.append(batch)
    return out


@dataclass(frozen=True)
class WarmStartResult:
    path: Path
    """The checkpoint directory, loadable by the engine and the trainer as ``[model] name``."""
    losses: list[float]
    """The loss of every update."""
    greedy: list[tuple[int, float]]
    """``(step, fraction of the check demonstrations greedy decoding reproduces)`` at each check."""
    coverage: list[tuple[int, float]] = field(default_factory=list)
    """``(step, fraction a group of samples would reproduce at least once)`` at each check."""
    sampled: list[tuple[int, float]] = field(default_factory=list)
    """``(step, mean probability that one sample reproduces a check demonstration)`` at each check."""

    @property
    def steps(self) -> int:
        return len(self.losses)


def warm_start(
    tasks: Sequence[Task],
    out: str | Path,
    *,
    system_prompt: str,
    agent_format: AgentFormat = "fenced",
    tools: Sequence[str] | None = None,
    config: WarmStartConfig | None = None,
    check_tasks: Sequence[Task] = (),
    on_step: Callable[[int, Metrics], None] | None = None,
    model: str = TINY,
    device: str = "cpu",
) -> WarmStartResult:
    """Fine-tune ``model`` on ``tasks``' demonstrations on ``device``, save it to ``out``.

    ``model`` is ``tiny`` (built with ``config.tiny``'s shape and seed) or a checkpoint directory.

    ``check_tasks`` (not trained on) are the demonstrations of the checks and their stops.
    ``on_step(step, metrics)`` is called after each update; at a check, ``metrics`` also has
    ``greedy``, ``coverage`` and ``sampled`` (the mean probability that one sample writes a check
    demonstration's reply).
    """
    cfg = config or WarmStartConfig()
    if (cfg.stop_at_greedy is not None or cfg.stop_at_sampled is not None) and not check_tasks:
        raise ConfigError(
            "stop_at_greedy and stop_at_sampled need check tasks: demonstrations the warm start does not train on"
        )
    net, tokenizer = _base_model(model, cfg.tiny)
    # Padded rows, not packed ones: the tiny model attends over a packed row's whole length (a block mask),
    # and its update took 1.9x as long packed (7.6 against 4.0 CPU-s, 16 demonstrations of 310 tokens).
    train = TrainConfig(lr=cfg.lr, warmup_steps=cfg.warmup_steps, device=device, packing=False)
    trainer = Trainer(net, train, tokenizer=tokenizer)
    samples = demonstrations(tasks, tokenizer, system_prompt, agent_format, tools)
    checks = demonstrations(check_tasks, tokenizer, system_prompt, agent_format, tools)
    losses: list[float] = []
    greedy: list[tuple[int, float]] = []
    coverage: list[tuple[int, float]] = []
    sampled_at: list[tuple[int, float]] = []
    for step, batch in enumerate(batches(samples, cfg.batch_size, cfg.steps, cfg.seed), start=1):
        metrics = trainer.sft_step(batch)
        losses.append(float(metrics["loss"]))
        done = False
        if checks and step % cfg.check_every == 0:
            fraction = sum(trainer.greedy_reproduces(checks)) / len(checks)
            p_reply = [
                math.exp(_reply_logprob(row, c)) for row, c in zip(trainer.logprobs(checks), checks, strict=True)
            ]
            covered = sum(_at_least_once(p, cfg.group_size) for p in p_reply) / len(checks)
            greedy.append((step, fraction))
            coverage.append((step, covered))
            sampled = sum(p_reply) / len(checks)
            sampled_at.append((step, sampled))
            metrics = {**metrics, "greedy": fraction, "coverage": covered, "sampled": sampled}
            done = (cfg.stop_at_greedy is not None and fraction >= cfg.stop_at_greedy) or (
                cfg.stop_at_sampled is not None and sampled >= cfg.stop_at_sampled
            )
        if on_step is not None:
            on_step(step, metrics)
        if done:
            break
    return WarmStartResult(save_weights(trainer.model.eval(), out, tokenizer), losses, greedy, coverage, sampled_at)


def _base_model(model: str, tiny: TinyModelConfig) -> tuple[Any, Tokenizer]:
    if model == TINY:
        return build_tiny_model(tiny)
    net, tokenizer, path = load_model(model)
    if tokenizer is None:
        raise ConfigError(f"{path} has no tokenizer files: the warm start renders its demonstrations with them")
    return net, tokenizer


def _reply_logprob(token_logprobs: Sequence[float], sample: TrainSample) -> float:
    """The log-probability that sampling at temperature 1 writes ``sample``'s model tokens exactly."""
    return sum(lp for lp, trained in zip(token_logprobs, sample.loss_mask, strict=True) if trained)


def _at_least_once(p: float, n: int) -> float:
    """``1 - (1 - p)^n``, accurate for tiny ``p`` too."""
    return 1.0 if p >= 1 else -math.expm1(n * math.log1p(-p))


def demonstrations(
    tasks: Sequence[Task],
    tokenizer: Tokenizer,
    system_prompt: str,
    agent_format: AgentFormat = "fenced",
    tools: Sequence[str] | None = None,
) -> list[TrainSample]:
    action_format = make_format(agent_format, tokenizer, system_prompt=system_prompt or None, tools=tools)
    chat = ChatFormat(tokenizer, tools=action_format.tools)
    return [demonstration(task, chat, action_format) for task in tasks]
