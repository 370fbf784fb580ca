"""``sandrl eval``: run an agent over a task set; report pass@k per task and why episodes failed.

::

    sandrl eval builtin --agent oracle
    sandrl eval builtin --agent null --task 'fix-*' --limit 4 --seed 1 --results-dir runs/eval/null
    sandrl eval tasks/ --agent llm --inference embedded --model tiny --samples 4 --out rollouts.jsonl
    sandrl eval tasks/ --agent llm --inference http://127.0.0.1:30000 --model /ckpt/step-10

The policy for ``--agent llm`` is the embedded engine (``--inference embedded``, loading
``--model``) or a server with SGLang's routes (``--inference URL``); over HTTP ``--model``
names where the tokenizer is (``tiny``: the byte tokenizer; a checkpoint directory: its files).
The episodes run as a training run's do (:func:`~sandrl.wiring.runner.build_runner`); an option
left unset keeps :class:`~sandrl.wiring.config.RolloutConfig`'s default. Every task's image is
fetched ahead in the background from the start (:func:`~sandrl.rollout.prefetch.images_ahead`):
an episode waits only for its own image, and at most ``concurrency`` fetches its episodes asked for
run at once (there used to be one per task, all at once). The per-task table and
the grouped failures are :mod:`sandrl.wiring.eval_report`'s; with a results directory the resolved
config, the results and every trajectory are written there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from rich.console import Console
from rich.markup import escape

from sandrl.errors import ConfigError
from sandrl.host_memory import process_memory_bytes
from sandrl.inference.base import InferenceClient
from sandrl.rollout.agent import Agent
from sandrl.rollout.agents.cli import CLI_AGENTS
from sandrl.rollout.agents.harness import HARNESSES
from sandrl.rollout.agents.scripted import DEFAULT_REPLAY, NullAgent, OracleAgent, ReplayAgent, ThinkTime
from sandrl.rollout.jsonl import TrajectoryWriter
from sandrl.rollout.prefetch import images_ahead
from sandrl.rollout.runner import RunResult
from sandrl.rollout.summary import print_summary
from sandrl.sandbox.base import SandboxProvider
from sandrl.tasks.swebench_specs import images_setting
from sandrl.tasks.task import Task
from sandrl.wiring.config import ModelConfig, RolloutConfig
from sandrl.wiring.eval_report import print_report, report
from sandrl.wiring.policy import open_policy
from sandrl.wiring.runner import build_runner, open_agent
from sandrl.wiring.sandboxes import open_provider
from sandrl.wiring.tasks import load_task_set, task_path

CONFIG_FILE = "config.json"
"""The resolved config, in the results directory."""
RESULTS_FILE = "results.json"
"""The summary, the per-task pass@k and the grouped failures, in the results directory."""

AgentName = Literal["llm", "oracle", "null", "replay"]
AGENTS: tuple[AgentName, ...] = ("llm", "oracle", "null", "replay")
"""sandrl's own agents; a harness agent is ``mini-swe-agent`` or ``module:function``
(see :mod:`sandrl.rollout.agents.harness`)."""


@dataclass(frozen=True)
class EvalConfig:
    """Everything ``sandrl eval`` takes; each field is one command-line option.

    The episode settings (``concurrency``, ``max_*``, ``temperature``, ``system_prompt``,
    ``host_capacity``) override :class:`RolloutConfig`'s defaults; None keeps the default
    (:meth:`rollout` applies them). ``samples`` is the group size.
    """

    tasks: str
    """A task directory, a directory of them, a SWE-bench file, or ``builtin`` (the shipped suite)."""
    agent: str = "oracle"
    """One of :data:`AGENTS`, ``mini-swe-agent``, ``terminus-2``, ``claude-code``, ``codex``, or
    ``module:function`` (a harness)."""
    inference: str | None = None
    """``embedded`` or the URL of an inference server; needed by the agents with a model (llm, harnesses)."""
    format: str | None = None
    """The llm agent's action format: ``fenced`` or ``tools``; None: ``trained_with``'s or the default."""
    tool_parser: str | None = None
    """The tool-call parser (hermes, glm45, llama3_json); None: detected from the chat template."""
    model: str = "tiny"
    samples: int = 1
    """Episodes per task (a GRPO group)."""
    concurrency: int | None = None
    out: Path | None = None
    """Write every trajectory here as JSONL (``--save-rollouts``)."""
    max_turns: int | None = None
    max_total_tokens: int | None = None
    """Capped at the model's context length."""
    max_new_tokens: int | None = None
    temperature: float | None = None
    replay: Sequence[str] = field(default_factory=lambda: DEFAULT_REPLAY)
    """The replay agent's commands (``@solution`` = the task's solution)."""
    think_s: tuple[float, float] = (1.0, 2.0)
    """The replay agent's emulated model time per turn, low and high."""
    run_id: str | None = None
    max_attempts: int | None = None
    system_prompt: str | None = None
    """The LLM agent's system prompt (the one the policy was trained with)."""
    host_capacity: int | None = None
    """Commands at once across the sandboxes, the rest queue (``RunnerConfig.host_capacity``)."""
    swebench_images: str | None = None
    """Where SWE-bench instances run: :attr:`~sandrl.wiring.config.TasksConfig.swebench_images`."""
    fork_groups: bool | None = None
    """Set each task up once per group and fork its episodes from it (``--fork-groups``; ``[rollout] fork_groups``)."""
    sandboxes: str | None = None
    """``local`` or ``e2b``: :attr:`~sandrl.wiring.config.RolloutConfig.sandboxes`."""
    task_pattern: str | None = None
    """Only the tasks whose name matches this glob (``--task``, e.g. ``fix-*``)."""
    limit: int | None = None
    """At most this many tasks (``--limit``): a sample drawn with ``seed``, the same for the same seed."""
    seed: int = 0
    """Seeds the ``--limit`` sample, the embedded engine's samplers and the replay agent's think times."""
    trained_with: RolloutConfig | None = None
    """A training run's ``[rollout]`` (``--config``): the episode settings start from it instead of
    :class:`RolloutConfig`'s defaults, so the policy is evaluated as it was trained."""
    trained_model: ModelConfig | None = None
    """The training run's ``[model]``: its API and token settings; ``model`` and ``inference`` still name what runs."""
    results_dir: Path | None = None
    """Where the resolved config (``config.json``), the results (``results.json``) and, without
    ``out``, every trajectory (``rollouts.jsonl``) are written; None: nowhere."""

    def __post_init__(self) -> None:
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"--limit must be at least 1 task, got {self.limit}")
        if self.agent not in AGENTS and not self.uses_harness:
            raise ConfigError(
                f"--agent must be one of {', '.join((*AGENTS, *HARNESSES, *CLI_AGENTS))} or module:function, "
                f"got {self.agent!r}"
            )
        if self.uses_model and not self.inference:
            raise ConfigError(f"--agent {self.agent} needs --inference: 'embedded' or the URL of an inference server")
        try:
            images_setting(self.swebench_images)
        except ValueError as exc:
            raise ConfigError(f"--swebench-images: {exc}") from exc
        self.rollout()  # the episode settings' checks (the runner's: RunnerConfig's)

    @property
    def uses_harness(self) -> bool:
        return self.agent in HARNESSES or self.agent in CLI_AGENTS or ":" in self.agent

    @property
    def uses_model(self) -> bool:
        return self.agent == "llm" or self.uses_harness

    def rollout(self) -> RolloutConfig:
        """The episode settings: :class:`RolloutConfig`'s defaults with the options given."""
        given: dict[str, Any] = {
            "concurrency": self.concurrency,
            "max_turns": self.max_turns,
            "max_total_tokens": self.max_total_tokens,
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "max_attempts": self.max_attempts,
            "system_prompt": self.system_prompt,
            "host_capacity": self.host_capacity,
            "agent": self.agent if self.uses_model else "llm",
            "format": self.format,
            "tool_parser": self.tool_parser,
            "sandboxes": self.sandboxes,
        }
        if self.fork_groups is not None:
            given["fork_groups"] = self.fork_groups
        start = self.trained_with if self.trained_with is not None else RolloutConfig()
        try:
            return dataclasses.replace(
                start, group_size=self.samples, **{k: v for k, v in given.items() if v is not None}
            )
        except ConfigError as exc:
            raise ConfigError(self._option_error(exc.message)) from exc

    def _option_error(self, message: str) -> str:
        """A check of RunnerConfig's (``group_size must be >= 1, got 0``) in ``sandrl eval``'s words for its options."""
        key = message.partition(" ")[0]
        if key in ("group_size", "concurrency"):
            return "--samples and --concurrency must be at least 1"
        if key == "host_capacity":
            return f"--host-capacity must be at least 1 command at once, got {self.host_capacity}"
        return f"sandrl eval: {message}"

    def rollouts_path(self) -> Path | None:
        """Where every trajectory is written: ``out``, else the results directory's ``rollouts.jsonl``."""
        if self.out is not None:
            return self.out
        return self.results_dir / "rollouts.jsonl" if self.results_dir is not None else None

    def resolved(self) -> dict[str, Any]:
        """Every setting of this evaluation, the episode settings as resolved, as JSON-ready data."""
        fields = {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(self).items()}
        model = self.model_config()
        return {
            **{k: v for k, v in fields.items() if k not in ("trained_with", "trained_model")},
            "replay": list(self.replay),
            "rollout": dataclasses.asdict(self.rollout()),
            "model_config": dataclasses.asdict(model) if model is not None else None,
        }

    def model_config(self) -> ModelConfig | None:
        """The policy the agent samples; None for the agents without a model."""
        if not self.uses_model:
            return None
        assert self.inference is not None
        if self.trained_model is not None:
            return dataclasses.replace(self.trained_model, name=self.model, inference=self.inference)
        return ModelConfig(name=self.model, inference=self.inference)


def rollout_of(section: RolloutConfig) -> RolloutConfig:
    """The episode settings of a training run's ``[rollout]`` (a subclass with GRPO's keys), without them."""
    return RolloutConfig(**{f.name: getattr(section, f.name) for f in dataclasses.fields(RolloutConfig) if f.init})


def scripted_agent(config: EvalConfig) -> Agent | None:
    """The agent of ``--agent`` when it has no model; None for ``llm`` (built with its policy)."""
    if config.agent == "oracle":
        return OracleAgent()
    if config.agent == "null":
        return NullAgent()
    if config.agent == "replay":
        low, high = config.think_s
        return ReplayAgent(list(config.replay), ThinkTime(round(low * 100), round(high * 100), 100.0), seed=config.seed)
    return None


def select_tasks(tasks: Sequence[Task], config: EvalConfig) -> list[Task]:
    """The tasks ``--task`` and ``--limit`` keep, in name order; a pattern matching none is a ConfigError."""
    chosen = sorted(tasks, key=lambda t: t.id)
    if config.task_pattern is not None:
        chosen = [t for t in chosen if fnmatch.fnmatchcase(t.id, config.task_pattern)]
        if not chosen:
            names = ", ".join(t.id for t in sorted(tasks, key=lambda t: t.id)[:5])
            raise ConfigError(
                f"--task {config.task_pattern!r} matches none of the {len(tasks)} tasks under "
                f"{task_path(config.tasks)} (a glob on task names, e.g. {names}, ...)"
            )
    if config.limit is not None and config.limit < len(chosen):
        chosen = sorted(random.Random(config.seed).sample(chosen, config.limit), key=lambda t: t.id)
    return chosen


async def evaluate(
    config: EvalConfig,
    *,
    provider: SandboxProvider | None = None,
    progress: bool = True,
    console: Console | None = None,
) -> RunResult:
    """Run the evaluation; print the summary; return every group and the summary."""
    tasks = select_tasks(load_task_set(config.tasks, swebench_images=config.swebench_images), config)
    model = config.model_config()
    if config.results_dir is not None:
        start_results_dir(config)
    rollouts = config.rollouts_path()
    writer = TrajectoryWriter(rollouts) if rollouts is not None else None
    try:
        async with contextlib.AsyncExitStack() as stack:
            policy: InferenceClient | None = None
            agent = scripted_agent(config)
            if model is not None:
                policy = await stack.enter_async_context(open_policy(model, seed=config.seed))
                agent = await stack.enter_async_context(open_agent(config.rollout(), policy))
            if provider is None:
                provider = await stack.enter_async_context(open_provider(config.rollout()))
            # Every task's image fetched ahead, in the tasks' order: an episode waits for its own only.
            rollout = config.rollout()
            prefetch = await stack.enter_async_context(images_ahead(provider, tasks, episode_jobs=rollout.concurrency))
            runner = build_runner(
                rollout,
                provider,
                policy=policy,
                agent=agent,
                run_id=config.run_id,
                writer=writer,
                image_for=prefetch.images,
            )
            result = await runner.run(tasks, progress=progress)
            images = prefetch.report()
    finally:
        if writer is not None:
            writer.close()
    print_summary(result.summary, console)
    print_report(result.trajectories, console or Console(stderr=True))
    if images is not None:
        (console or Console(stderr=True)).print(f"images: {escape(images.line())}", highlight=False)
    if config.results_dir is not None:
        results = {**result_line(config, result), **report(result.trajectories)}
        if images is not None:
            results["images"] = images.to_dict()
        (config.results_dir / RESULTS_FILE).write_text(json.dumps(results, indent=2, default=str) + "\n")
    return result


def default_results_dir(now: datetime | None = None) -> Path:
    """``runs/eval/<UTC time>/``, relative to the working directory (a run in the same second gets ``-2``...)."""
    base = Path("runs") / "eval" / (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def start_results_dir(config: EvalConfig) -> None:
    """Make the results directory and write the resolved config into it, before any episode runs;
    a directory that holds an earlier eval's results is refused rather than overwritten. One whose
    eval did not finish (a config, maybe some trajectories, no results) is evaluated again, as the
    line of the interrupted eval says."""
    assert config.results_dir is not None
    path = config.results_dir
    if (path / RESULTS_FILE).exists():
        raise ConfigError(f"--results-dir {path} holds an earlier eval's results; give another directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
        (path / CONFIG_FILE).write_text(json.dumps(config.resolved(), indent=2, default=str) + "\n")
    except OSError as exc:
        raise ConfigError(f"--results-dir {path}: cannot write there: {exc}") from exc


def interrupted_line(config: EvalConfig) -> str:
    """What an eval stopped before its end left on disk, for the line ``interrupted: ...``."""
    rollouts = config.rollouts_path()
    if rollouts is None:
        return "nothing was kept (no --out and no results directory); rerun the same command to evaluate again"
    done = sum(1 for _ in rollouts.open()) if rollouts.is_file() else 0
    said = f"{done} episodes finished, their trajectories in {rollouts}"
    if config.results_dir is not None:
        said += f" (no {RESULTS_FILE}: the eval did not finish)"
    return said + "; rerun the same command to evaluate again"


def nothing_ran(result: RunResult) -> str | None:
    """Why no episode could be judged at all (every one an infra error: builds failed, sandboxes
    could not be made, verifiers broke), for ``sandrl eval``'s exit status; None if any was."""
    summary = result.summary
    if summary["episodes"] == 0 or summary["verified"] > 0:
        return None
    causes = ", ".join(f"{code} x{count}" for code, count in summary["errors"].items()) or "no reward"
    first = next((t.error.message for t in result.trajectories if t.error is not None), None)
    return (
        f"no episode could run: all {summary['episodes']} ended without a reward ({causes})"
        + (f"; the first: {first}" if first else "")
        + "; fix that before reading the pass rate"
    )


def result_line(config: EvalConfig, result: RunResult) -> dict[str, Any]:
    """The JSON line ``sandrl eval`` ends with."""
    mean = report(result.trajectories)["mean"]
    return {
        "eval": config.tasks,
        "agent": config.agent,
        "samples": config.samples,
        "wall_s": round(result.wall_s, 3),
        "out": str(config.out) if config.out is not None else None,
        "results_dir": str(config.results_dir) if config.results_dir is not None else None,
        **result.summary,
        "pass@1": mean["pass@1"],
        f"pass@{config.samples}": mean["pass@n"],
        "rss_peak_mb": round(memory[1] / 2**20, 1) if (memory := process_memory_bytes()) else None,
    }
