"""One run, one TOML file: what ``sandrl train CONFIG`` reads, checks on load and saves resolved.

.. code-block:: toml

    [run]                       # RunSection: where the run writes, how long it trains
    output_dir = "runs/tiny"    # relative to the working directory; other paths: to this file
    steps = 20
    groups_per_step = 4

    [model]                     # sandrl.wiring.config.ModelConfig
    name = "tiny"

    [inference]                 # sandrl.inference.fleet.config.FleetConfig: engines sandrl starts
    launch = "embedded"         # or "sglang", "vllm"; left out: [model] inference says where the policy is
    engines = 2

    [tasks]                     # sandrl.wiring.config.TasksConfig: a task directory, or a generated family
    family = "echo"
    count = 32

    [rollout]                   # RolloutSection: sandrl.wiring.config.RolloutConfig + GRPO's scale_rewards
    group_size = 4

    [rollout.timeouts]          # sandrl.rollout.episode.EpisodeTimeouts
    setup_timeout_s = 600.0

    [async]                     # AsyncSection: used by --mode async
    max_staleness = 1

    [train]                     # sandrl.train.config.TrainConfig
    lr = 1e-5

    [warm_start]                # WarmStartSection: supervised on reference solutions first (--warm-start)
    enabled = true

Every section and key is checked when the file loads: an unknown key, a wrong type or a
contradiction is a :class:`~sandrl.errors.ConfigError` naming the file, the key and what would
be valid. :func:`save_resolved` writes every setting, defaults included, as TOML next to the
checkpoints (``<output_dir>/config.toml``), which :func:`load_run_config` reads back unchanged.
``--set section.key=value`` changes one setting from the command line (:mod:`sandrl.train.overrides`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sandrl.errors import ConfigError
from sandrl.inference.fleet.config import FleetConfig
from sandrl.tasks.builtin.generated import FAMILIES
from sandrl.toml_config import from_mapping, none_as_false, read_toml
from sandrl.train.config import TrainConfig
from sandrl.train.loss_config import ScaleRewards
from sandrl.train.overrides import apply_overrides
from sandrl.train.trackers.names import check_trackers
from sandrl.train.truncation import TruncationPolicy, check_budgets
from sandrl.train.warm_start_config import WarmStartConfig
from sandrl.wiring.config import ModelConfig, RolloutConfig, TasksConfig

Mode = Literal["sync", "async"]
MODES: tuple[Mode, ...] = ("sync", "async")


@dataclass(frozen=True)
class RunSection:
    """Where the run writes and how long it trains."""

    output_dir: str = "runs/sandrl"
    """Checkpoints (``checkpoints/``), ``metrics.jsonl``, ``rollouts.jsonl`` and the resolved ``config.toml``.
    A relative path is relative to the working directory ``sandrl train`` runs in (not to the config
    file, as the other paths are); ``--output-dir`` replaces it."""
    mode: Mode = "sync"
    """The driver when ``--mode`` is not given."""
    steps: int = 10
    """Training steps (one ``Trainer.step`` each); with ``--rollout-only``, batches collected."""
    groups_per_step: int = 4
    """Groups (tasks) in one step's batch; each holds ``rollout.group_size`` episodes."""
    seed: int = 0
    """Seeds the order in which tasks are drawn (a new shuffle every pass over them) and the embedded
    engine's sampling (a server seeds its own)."""
    checkpoint_every: int = 0
    """Save a checkpoint every this many steps; 0: only at the end. The run resumes from the newest."""
    save_rollouts: bool = True
    """Append every trajectory to ``<output_dir>/rollouts.jsonl`` (what ``--load-rollouts`` reads)."""
    resume: bool = True
    """Continue from the newest checkpoint under ``<output_dir>/checkpoints`` if there is one."""
    trackers: tuple[str, ...] = ("jsonl",)
    """Where each step's metrics, the resolved config and a few sample episodes go: ``jsonl``
    (``metrics.jsonl``, always written, listed or not), ``tensorboard`` (``<output_dir>/tensorboard``),
    ``wandb`` (offline under ``<output_dir>/wandb`` unless ``WANDB_MODE`` says otherwise), ``mlflow``
    (``<output_dir>/mlruns`` unless ``MLFLOW_TRACKING_URI`` is set). All but ``jsonl`` need
    ``pip install 'sandrl[trackers]'``. A tracker that fails is reported once; the run goes on."""

    def __post_init__(self) -> None:
        if not self.output_dir:
            raise ConfigError("output_dir must name a directory")
        check_trackers(self.trackers)
        for name in ("steps", "groups_per_step"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.checkpoint_every < 0:
            raise ConfigError(f"checkpoint_every must be >= 0 (0: only at the end), got {self.checkpoint_every}")


@dataclass(frozen=True)
class RolloutSection(RolloutConfig):
    """``[rollout]`` of a training run: :class:`~sandrl.wiring.config.RolloutConfig` (the runner, the
    budget, ``[rollout.timeouts]``, the agent and its sampling), plus what GRPO needs of its groups."""

    scale_rewards: ScaleRewards = "group"
    """How advantages are scaled: the same as ``[train.loss] scale_rewards``, which is where it belongs
    (said here, it sets that one; the two may not differ)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.group_size < 2:
            raise ConfigError(f"group_size must be >= 2 (GRPO compares the samples of a task), got {self.group_size}")
        if self.temperature <= 0:
            raise ConfigError(f"temperature must be > 0 for RL (sampling, not greedy), got {self.temperature!r}")

    @classmethod
    def of(cls, rollout: RolloutConfig, **grpo: Any) -> RolloutSection:
        """``rollout``'s settings as a training run's, with ``grpo`` (``scale_rewards``) or its defaults."""
        return cls(**{f.name: getattr(rollout, f.name) for f in dataclasses.fields(rollout)}, **grpo)


@dataclass(frozen=True)
class AsyncSection:
    """The asynchronous driver: rollouts run ahead of the trainer by at most ``max_staleness`` versions."""

    max_staleness: int = 1
    """A group sampled by weights more than this many versions behind the trainer's is not trained on.
    ``groups_per_step x (1 + max_staleness)`` groups are in flight or buffered at once."""
    on_stale: Literal["drop", "regenerate"] = "drop"
    """What happens to a too-stale group: ``drop`` it (counted), or ``regenerate`` it (its task runs again)."""
    update_interval: int = 1
    """Push the trainer's weights to the inference side every this many steps."""

    def __post_init__(self) -> None:
        if self.max_staleness < 0:
            raise ConfigError(f"max_staleness must be >= 0, got {self.max_staleness}")
        if self.update_interval < 1:
            raise ConfigError(f"update_interval must be >= 1, got {self.update_interval}")
        if self.update_interval > self.max_staleness + 1:
            raise ConfigError(
                f"update_interval ({self.update_interval}) > max_staleness + 1 ({self.max_staleness + 1}): "
                "samples would be too stale before new weights arrive; raise max_staleness or push more often"
            )


@dataclass(frozen=True)
class WarmStartSection(WarmStartConfig):
    """Before RL, fine-tune the policy on the tasks' reference solutions (``sandrl train --warm-start``).

    A policy that never writes a working action scores 0 in every episode of a group, and GRPO
    learns nothing from such groups: a tiny model trained from scratch, or a model that does not
    know the agent's format. The warm start trains ``[model] name`` (``tiny``: built with
    ``[warm_start.tiny]``'s shape) with supervised cross-entropy on demonstrations: each task's
    prompt as the agent sees it, answered by its ``solution/solve.sh`` in the agent's format
    (:mod:`sandrl.train.warmstart`). It runs once, into ``<output_dir>/warm_start/model``, and RL
    starts from that checkpoint; a resumed run or a rerun reuses it (one whose warm start settings
    changed is refused). ``group_size`` defaults to ``[rollout] group_size``.
    """

    enabled: bool = False
    """Warm-start before RL; ``sandrl train --warm-start`` sets it."""
    path: str = ""
    """The demonstrations: a task directory (or a directory of them) whose tasks have a reference
    solution; relative to the config file. Empty: from ``[tasks]``: for a generated ``family``,
    ``demonstrations`` new tasks of it from a seed of their own (RL's training tasks stay unseen: a
    policy that had memorised their answers would be rewarded for recall, not skill), else the
    tasks at its ``path`` that have a solution."""
    demonstrations: int = 256
    """With a generated ``[tasks] family`` and no ``path``: how many demonstration tasks are generated."""
    checks: int = 0
    """Demonstrations kept out of training to measure the warm start every ``check_every`` updates
    (greedy, sampled, coverage) and to stop it (``stop_at_greedy``, ``stop_at_sampled``): generated
    from another seed with a family, else drawn (seeded) from the demonstrations."""

    @classmethod
    def of(cls, warm: WarmStartConfig, **run: Any) -> WarmStartSection:
        """``warm``'s settings as a run's ``[warm_start]``, with ``run`` (``enabled``, ``path``...) or defaults."""
        return cls(**{f.name: getattr(warm, f.name) for f in dataclasses.fields(warm)}, **run)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.demonstrations < 1 or self.checks < 0:
            raise ConfigError(
                f"demonstrations must be >= 1 and checks >= 0, got {self.demonstrations} and {self.checks}"
            )
        if (self.stop_at_greedy is not None or self.stop_at_sampled is not None) and not self.checks:
            raise ConfigError(
                "stop_at_greedy and stop_at_sampled are measured on check demonstrations: set checks "
                "(32 is plenty), or drop them to train all the steps"
            )


@dataclass(frozen=True)
class RunConfig:
    """Everything one ``sandrl train`` run takes."""

    run: RunSection = field(default_factory=RunSection)
    model: ModelConfig = field(default_factory=ModelConfig)
    inference: FleetConfig = field(default_factory=FleetConfig)
    tasks: TasksConfig = field(default_factory=lambda: TasksConfig(family="echo"))
    rollout: RolloutSection = field(default_factory=RolloutSection)
    async_: AsyncSection = field(default_factory=AsyncSection)
    train: TrainConfig = field(default_factory=TrainConfig)
    warm_start: WarmStartSection = field(default_factory=WarmStartSection)

    @property
    def output_dir(self) -> Path:
        return Path(self.run.output_dir)

    def truncation(self, max_context: int | None = None) -> TruncationPolicy:
        """``[train] on_truncated`` and its settings, on the token budget the agent loop enforces: ``[rollout]
        max_total_tokens`` capped at the policy's context (``max_context``), as the runner caps it."""
        budget = self.rollout.max_total_tokens
        if max_context is not None:
            budget = min(budget, max_context)
        train = self.train
        return TruncationPolicy(
            train.on_truncated, train.truncated_by, train.overlong_buffer, train.overlong_penalty, token_budget=budget
        )

    def to_dict(self) -> dict[str, Any]:
        """TOML-ready (sections as tables, None written ``false``); :func:`from_dict` reads it back."""
        out: dict[str, Any] = {}
        for name in _SECTIONS:
            value = getattr(self, _SECTIONS[name])
            out[name] = value.to_dict() if isinstance(value, TrainConfig) else none_as_false(dataclasses.asdict(value))
        return out


_SECTIONS: dict[str, str] = {
    "run": "run",
    "model": "model",
    "inference": "inference",
    "tasks": "tasks",
    "rollout": "rollout",
    "async": "async_",
    "train": "train",
    "warm_start": "warm_start",
}
SECTION_TYPES: dict[str, type[Any]] = {
    "run": RunSection,
    "model": ModelConfig,
    "inference": FleetConfig,
    "tasks": TasksConfig,
    "rollout": RolloutSection,
    "async": AsyncSection,
    "train": TrainConfig,
    "warm_start": WarmStartSection,
}


def _one_scale_rewards(config: RunConfig, data: Mapping[str, object], where: str) -> RunConfig:
    """``[train.loss] scale_rewards`` is the one the advantages use; ``[rollout] scale_rewards``, where runs
    set it first, still says it when the loss's is not given, and may not say otherwise."""
    rollout, train = data.get("rollout", {}), data.get("train", {})
    loss = train.get("loss", {}) if isinstance(train, Mapping) else {}
    said = rollout.get("scale_rewards") if isinstance(rollout, Mapping) else None
    if said is None:
        return dataclasses.replace(
            config, rollout=dataclasses.replace(config.rollout, scale_rewards=config.train.loss.scale_rewards)
        )
    if isinstance(loss, Mapping) and "scale_rewards" in loss and loss["scale_rewards"] != said:
        raise ConfigError(
            f"{where}: [rollout] scale_rewards = {said!r} but [train.loss] scale_rewards = {loss['scale_rewards']!r}: "
            "keep the one in [train.loss]"
        )
    try:
        scaled = dataclasses.replace(config.train.loss, scale_rewards=config.rollout.scale_rewards)
    except ConfigError as exc:
        raise ConfigError(f"{where}: [train.loss]: {exc.message}") from exc
    return dataclasses.replace(config, train=dataclasses.replace(config.train, loss=scaled))


def from_dict(data: Mapping[str, object], *, where: str = "config", base: Path | None = None) -> RunConfig:
    """A :class:`RunConfig` from parsed TOML; relative paths are resolved against ``base``."""
    unknown = sorted(str(k) for k in data if k not in _SECTIONS)
    if unknown:
        raise ConfigError(
            f"{where}: unknown section(s) {', '.join(unknown)}; valid sections are {', '.join(_SECTIONS)}"
        )
    if "tasks" not in data:
        raise ConfigError(
            f"{where}: a [tasks] section is required: path = a task directory, or family = one of {', '.join(FAMILIES)}"
        )
    values: dict[str, Any] = {}
    for name, attr in _SECTIONS.items():
        values[attr] = from_mapping(SECTION_TYPES[name], data.get(name, {}), where=f"{where}: [{name}]")
    config = RunConfig(**values)
    warm = data.get("warm_start", {})
    if isinstance(warm, Mapping) and "group_size" not in warm:
        # The coverage it reports is a group's of the RL run: the RL run's group size unless set.
        config = dataclasses.replace(
            config, warm_start=dataclasses.replace(config.warm_start, group_size=config.rollout.group_size)
        )
    config = _one_scale_rewards(config, data, where)
    if config.inference.launched and not config.model.embedded:
        raise ConfigError(
            f"{where}: [inference] launch = {config.inference.launch!r} starts the engines, and [model] inference = "
            f"{config.model.inference!r} names engines started elsewhere: drop one of them"
        )
    if config.warm_start.enabled and config.tasks.sources and not config.warm_start.path:
        raise ConfigError(
            f"{where}: [warm_start] draws its demonstrations from one task set, not from [[tasks.sources]]: "
            "set [warm_start] path to a task set with solutions"
        )
    train = config.train
    try:
        check_budgets(
            train.on_truncated,
            train.truncated_by,
            train.overlong_buffer,
            max_total_tokens=config.rollout.max_total_tokens,
            max_turns=config.rollout.max_turns,
        )
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc.message}") from exc
    if base is not None:
        config = _resolve_paths(config, base)
    try:
        config.rollout.slots()  # a capacity file that is missing or not a contention result fails here
    except ConfigError as exc:
        raise ConfigError(f"{where}: [rollout] capacity_file: {exc.message}") from exc
    return config


def load_run_config(path: str | Path, overrides: Sequence[str] = ()) -> RunConfig:
    """Read and check the run config at ``path``, with ``overrides`` (``--set section.key=value``) applied."""
    file = Path(path)
    data = apply_overrides(read_toml(file), overrides, SECTION_TYPES)
    return from_dict(data, where=str(file), base=file.resolve().parent)


def save_resolved(config: RunConfig, path: str | Path | None = None) -> Path:
    """Write every setting of ``config`` as TOML (default: ``<output_dir>/config.toml``)."""
    target = Path(path) if path is not None else config.output_dir / "config.toml"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(
        "# The resolved config of this run (every default filled in), written by sandrl train.\n"
        + dumps(config.to_dict())
    )
    return target


def dumps(data: Mapping[str, Any], prefix: str = "") -> str:
    """Nested dicts of strings, numbers and booleans as TOML (enough for config files); a non-empty list
    of dicts is an array of tables (``[[tasks.sources]]``)."""
    lines = [f"{key} = {_value(value)}" for key, value in data.items() if not _is_table(value)]
    out = "\n".join(lines) + ("\n" if lines else "")
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out += f"\n[{name}]\n" + dumps(value, f"{name}.")
        elif _is_table(value):
            out += "".join(f"\n[[{name}]]\n" + dumps(item, f"{name}.") for item in value)
    return out


def _is_table(value: object) -> bool:
    """A table, or an array of tables, in TOML's terms."""
    if isinstance(value, list | tuple):
        return bool(value) and all(isinstance(item, Mapping) for item in value)
    return isinstance(value, Mapping)


def _value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return "inf" if value > 0 else ("-inf" if value < 0 else "nan")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise ConfigError(f"cannot write {type(value).__name__} {value!r} to TOML")


def _resolve_paths(config: RunConfig, base: Path) -> RunConfig:
    def absolute(path: str) -> str:
        return str(base / path) if path and path != "builtin" and not Path(path).is_absolute() else path

    model = config.model
    if model.name != "tiny" and (base / model.name).exists():
        model = dataclasses.replace(model, name=absolute(model.name))
    model = dataclasses.replace(model, token_file=absolute(model.token_file))
    return dataclasses.replace(
        config,
        run=dataclasses.replace(config.run, output_dir=_output_dir(config.run.output_dir, base)),
        tasks=dataclasses.replace(
            config.tasks,
            path=absolute(config.tasks.path),
            sources=tuple(dataclasses.replace(s, path=absolute(s.path)) for s in config.tasks.sources),
        ),
        warm_start=dataclasses.replace(config.warm_start, path=absolute(config.warm_start.path)),
        rollout=dataclasses.replace(config.rollout, capacity_file=absolute(config.rollout.capacity_file)),
        model=model,
    )


def _output_dir(path: str, base: Path) -> str:
    """``[run] output_dir`` made absolute against the working directory.

    Before, it was relative to the config file: a run started that way (its ``config.toml`` is
    there, nothing is at the new place) goes on where it is, with a warning, instead of starting
    over beside it.
    """
    if Path(path).is_absolute():
        return path
    here = Path.cwd() / path
    before = base / path
    if before.resolve() != here.resolve() and (before / "config.toml").is_file() and not here.exists():
        warnings.warn(
            f"output_dir {path!r} is relative to the working directory now, not to the config file; the run "
            f"already in {before} goes on there: write that path in the config (or --output-dir) to keep it so",
            stacklevel=2,
        )
        return str(before)
    return str(here)
