"""A run's warm start (``[warm_start]``, ``sandrl train --warm-start``): made once, then RL starts from it.

:func:`warm_start_run` fine-tunes ``[model] name`` on demonstrations (:func:`sandrl.train.warmstart.warm_start`)
into ``<output_dir>/warm_start/model`` and returns the run config with that checkpoint as its model:
the trainer starts from it, and the embedded engine serves it (an inference server is sent it by
:func:`sandrl.train.command.run_training`). ``warm_start/result.json``, written after the
checkpoint, marks it complete and records what it was made from, so a resumed run or a rerun
reuses it, and one whose warm start settings changed is refused instead of quietly training on
from the old one. The run's own ``config.toml`` then names the checkpoint as its model, and
running that file again reuses it too.

The demonstrations are the reference solutions of ``[warm_start] path``'s tasks or, by default,
of the run's ``[tasks]``: for a generated family, tasks of the family from seeds of their own
(:data:`DEMONSTRATION_SEED_OFFSET`, :data:`CHECK_SEED_OFFSET`), written under ``warm_start/tasks/``.
"""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from rich.console import Console

from sandrl.errors import ConfigError
from sandrl.rollout.agents.formats import AgentFormat
from sandrl.tasks.task import Task
from sandrl.train.run_config import RunConfig
from sandrl.train.trainer import Metrics
from sandrl.train.warmstart import warm_start
from sandrl.wiring import load_task_set

DEMONSTRATION_SEED_OFFSET = 3000
"""A generated family's demonstrations are its tasks of ``[tasks] seed`` + this (``sandrl demo``'s too)."""
CHECK_SEED_OFFSET = 2000
"""And its check demonstrations, those of ``[tasks] seed`` + this."""


class WarmStartStopped(Exception):
    """The warm start stopped between two updates because its ``stop`` event was set; nothing was saved."""


@dataclass(frozen=True)
class WarmStarted:
    """The warm-started checkpoint of a run and how it was made (``warm_start/result.json``)."""

    path: Path
    """The checkpoint: the RL run's ``[model] name``."""
    steps: int
    """Supervised updates made."""
    loss_first: float
    loss_last: float
    greedy: list[tuple[int, float]]
    """``(step, fraction of the check demonstrations greedy decoding reproduces)`` at each check."""
    coverage: list[tuple[int, float]]
    """``(step, fraction a group of [rollout] group_size samples writes at least once)`` at each check."""
    sampled: list[tuple[int, float]]
    """``(step, mean probability that one sample writes a check demonstration)`` at each check."""
    wall_s: float
    demonstrations: int
    checks: int
    group_size: int
    reused: bool = False
    """Made by an earlier start of this run, not now."""

    def summary(self) -> str:
        """One line: what the warm start did and where the checkpoint is."""
        checked = (
            f"; of {self.checks} check demonstrations one sample writes {self.sampled[-1][1]:.0%}, greedy decoding "
            f"{self.greedy[-1][1]:.0%}, a group of {self.group_size} samples {self.coverage[-1][1]:.0%}"
            if self.greedy
            else ""
        )
        when = "made earlier, reused" if self.reused else f"{self.wall_s:.0f} s"
        return (
            f"warm start: {self.steps} supervised steps on {self.demonstrations} demonstrations, loss "
            f"{self.loss_first:.2f} -> {self.loss_last:.3f}{checked} ({when}): {self.path}"
        )


def warm_start_run(
    config: RunConfig, *, console: Console | None = None, stop: threading.Event | None = None
) -> tuple[RunConfig, WarmStarted | None]:
    """``config`` as RL trains it: with ``[warm_start] enabled``, its model is the warm-started checkpoint
    (made now, or reused); the warm start's record, None when it is off.

    ``stop`` set (from another thread) ends the warm start at its next update with :class:`WarmStartStopped`.
    """
    section = config.warm_start
    if not section.enabled:
        return config, None
    con = console or Console(stderr=True)
    root = config.output_dir / "warm_start"
    model_dir = root / "model"
    result = root / "result.json"
    already = Path(config.model.name).resolve() == model_dir.resolve()
    settings = _settings(config, base=None if already else config.model.name)
    if result.is_file():
        recorded = _read(result, root)
        before = recorded["settings"]
        if already:
            settings["model"] = before["model"]  # the run's own config.toml names the checkpoint
        now, then = _flat(settings), _flat(before)
        changed = sorted(k for k in now.keys() | then.keys() if now.get(k) != then.get(k))
        if changed:
            differ = "differs" if len(changed) == 1 else "differ"
            raise ConfigError(
                f"{root} holds a warm start made with other settings ({', '.join(changed)} {differ}): give the run "
                f"another --output-dir, or delete {root} to warm-start it again"
            )
        done = _record(recorded, model_dir, reused=True, where=result)
        if not already:
            con.print(done.summary(), markup=False, highlight=False, soft_wrap=True)
    elif already:
        raise ConfigError(
            f"[model] name is the warm start checkpoint {model_dir}, but {result} is missing: it was not "
            "completed; set [model] name to the model to warm-start (e.g. tiny)"
        )
    else:
        done = _make(config, root, settings, con, stop or threading.Event())
    return dataclasses.replace(config, model=dataclasses.replace(config.model, name=str(model_dir))), done


def _make(config: RunConfig, root: Path, settings: dict[str, Any], con: Console, stop: threading.Event) -> WarmStarted:
    section = config.warm_start
    demos, checks = demonstrations(config, root / "tasks")
    every = section.check_every
    con.print(
        f"warm start: up to {section.steps} supervised steps on {len(demos)} demonstrations"
        + (f", checked on {len(checks)} others every {every} steps" if checks else ""),
        markup=False,
        highlight=False,
        soft_wrap=True,
    )

    def progress(step: int, metrics: Metrics) -> None:
        if stop.is_set():
            raise WarmStartStopped(f"the warm start stopped at step {step} of {section.steps}; nothing was saved")
        if step % every and step != section.steps:
            return
        line = f"warm start {step}/{section.steps}  loss {metrics['loss']:.3f}"
        if "greedy" in metrics:
            line += (
                f"  checks: one sample {metrics['sampled']:.0%}, greedy {metrics['greedy']:.0%}, "
                f"a group of {section.group_size} {metrics['coverage']:.0%}"
            )
        con.print(line, markup=False, highlight=False, soft_wrap=True)

    started = time.monotonic()
    made = warm_start(
        demos,
        root / "model",
        system_prompt=config.rollout.system_prompt,
        agent_format=cast(AgentFormat, config.rollout.format),
        tools=config.rollout.tool_names(),
        config=section,
        check_tasks=checks,
        on_step=progress,
        model=config.model.name,
        device=config.train.device,
    )
    record = {
        "settings": settings,
        "steps": made.steps,
        "loss_first": made.losses[0],
        "loss_last": made.losses[-1],
        "greedy": made.greedy,
        "coverage": made.coverage,
        "sampled": made.sampled,
        "wall_s": time.monotonic() - started,
        "demonstrations": len(demos),
        "checks": len(checks),
        "group_size": section.group_size,
    }
    staging = root / "result.json.tmp"
    staging.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    staging.replace(root / "result.json")  # last: the checkpoint is complete once this exists
    done = _record(record, made.path, reused=False, where=root / "result.json")
    con.print(done.summary(), markup=False, highlight=False, soft_wrap=True)
    return done


def demonstrations(config: RunConfig, root: Path) -> tuple[list[Task], list[Task]]:
    """The tasks the warm start trains on and those it checks on (see :class:`WarmStartSection`)."""
    section = config.warm_start
    tasks = config.tasks
    if not section.path and tasks.family:
        from sandrl.tasks.builtin.generated import generate_tasks

        def family(name: str, count: int, offset: int) -> list[Task]:
            shutil.rmtree(root / name, ignore_errors=True)  # what an interrupted start left
            generate_tasks(root / name, tasks.family, count, tasks.seed + offset)
            return load_task_set(root / name)

        checks = family("checks", section.checks, CHECK_SEED_OFFSET) if section.checks else []
        return family("demonstrations", section.demonstrations, DEMONSTRATION_SEED_OFFSET), checks
    where = section.path or tasks.path
    loaded = load_task_set(where, swebench_images=None if section.path else tasks.swebench_images)
    solved = [t for t in loaded if _has_solution(t)]
    if len(solved) <= section.checks:
        raise ConfigError(
            f"[warm_start]: {len(solved)} of the {len(loaded)} tasks under {where} have a reference solution "
            f"(solution/solve.sh) to demonstrate, and {section.checks} are kept for checks: give [warm_start] path "
            "a task set with solutions, or lower checks"
        )
    held = set(random.Random(f"sandrl.warm_start:{section.seed}").sample(range(len(solved)), section.checks))
    return [t for i, t in enumerate(solved) if i not in held], [t for i, t in enumerate(solved) if i in held]


def _has_solution(task: Task) -> bool:
    script = task.solution.script if task.solution is not None else None
    return script is not None and script.is_file()


def _settings(config: RunConfig, *, base: str | None) -> dict[str, Any]:
    """What the checkpoint depends on, as JSON reads it back (``group_size`` only names a report)."""
    section = dataclasses.asdict(config.warm_start)
    for key in ("enabled", "group_size"):
        section.pop(key)
    tasks = config.tasks
    source: dict[str, Any] = (
        {"family": tasks.family, "seed": tasks.seed}
        if tasks.family and not config.warm_start.path
        else {"path": config.warm_start.path or tasks.path}
    )
    rollout = config.rollout
    agent = {"format": rollout.format, "system_prompt": rollout.system_prompt, "tools": rollout.tool_names()}
    settings = {"warm_start": section, "model": base, "demonstrations": source, "agent": agent}
    loaded: dict[str, Any] = json.loads(json.dumps(settings))
    return loaded


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _read(result: Path, root: Path) -> dict[str, Any]:
    try:
        data = json.loads(result.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {result} ({exc}): delete {root} to warm-start again") from None
    if not isinstance(data, dict) or not isinstance(data.get("settings"), dict):
        raise ConfigError(f"{result} is not a warm start record: delete {root} to warm-start again")
    return data


def _record(data: dict[str, Any], path: Path, *, reused: bool, where: Path) -> WarmStarted:
    def pairs(key: str) -> list[tuple[int, float]]:
        return [(int(step), float(value)) for step, value in data[key]]

    try:
        return WarmStarted(
            path=path,
            steps=int(data["steps"]),
            loss_first=float(data["loss_first"]),
            loss_last=float(data["loss_last"]),
            greedy=pairs("greedy"),
            coverage=pairs("coverage"),
            sampled=pairs("sampled"),
            wall_s=float(data["wall_s"]),
            demonstrations=int(data["demonstrations"]),
            checks=int(data["checks"]),
            group_size=int(data["group_size"]),
            reused=reused,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{where} is not a warm start record ({exc!r}): delete it to warm-start again") from None
