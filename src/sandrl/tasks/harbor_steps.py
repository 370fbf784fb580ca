"""Harbor multi-step tasks: ``[[steps]]`` in task.toml and a ``steps/`` directory, read as Harbor reads them.

::

    my-task/
    ├── task.toml               [[steps]] name = "01-setup" ... ; multi_step_reward_strategy = "mean"
    ├── environment/            one environment, shared by every step
    ├── tests/                  optional: every step's tests start from it (test.sh as a fallback)
    └── steps/
        ├── 01-setup/
        │   ├── instruction.md  the step's instruction (required)
        │   ├── tests/          over the task's tests/ (test.sh here, or in tests/)
        │   ├── solution/       solve.sh: the step's part of the oracle (optional)
        │   └── workdir/        copied into the working directory; setup.sh there is run (optional)
        └── 02-extend/ ...

The facts are Harbor 0.26's (``harbor.models.task.config.StepConfig``, ``harbor.trial.multi_step``):
steps run in the order of ``[[steps]]`` in one environment, each in turn: its ``workdir/`` copied
into the working directory and its ``setup.sh`` run there, its ``[steps.healthcheck]``, the agent on
its instruction (the next step's continues the same conversation), its artifacts recorded, its
verifier (``/tests`` and ``/logs/verifier`` fresh for each, and emptied again before the next step's
agent); a step's verifier env is the task's with the step's over it; a step whose rewards fall below
its ``min_reward`` (a number: the ``reward`` key; a table: each key; a missing key counts as below)
ends the trial; the trial's rewards are the per-key mean over the steps that were verified (a key a
step lacks counts 0; ``mean``, the default) or the last verified step's (``final``). The oracle runs
each step's ``solution/solve.sh`` (else the task's ``solution/solve.sh``) before that step's verifier.
A step's timeouts are its own ``[steps.agent]`` / ``[steps.verifier] timeout_sec``, else the task's.

This module reads the steps; :mod:`sandrl.tasks.multi_step` is the task's side of running them and
:mod:`sandrl.rollout.multi_step` the episode's. The task-level :attr:`~sandrl.tasks.task.Task.instruction`,
``verifier`` and ``solution`` of a multi-step task describe the whole (every step's, in order) for
listings and ``run_solution``; an episode never gives them to an agent.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from sandrl.errors import InvalidTaskError
from sandrl.tasks.fields import config_table, read_text, warn
from sandrl.tasks.task import TESTS_DIR, Healthcheck, SolutionSpec, StepReward, TaskStep, VerifierSpec
from sandrl.toml_config import Table, type_name

STEPS_DIR = "steps"
STRATEGIES: tuple[StepReward, ...] = ("mean", "final")
SOLUTIONS = "/solution/.sandrl-steps"
"""Where the steps' solution directories wait; each is put at /solution just before its solve.sh runs."""
TEST_COMMAND = f"chmod +x {TESTS_DIR}/test.sh && {TESTS_DIR}/test.sh"
ARTIFACTS_DIR = "/logs/artifacts"
"""Harbor's conventional directory a step's commands publish files in: recorded with every step's artifacts."""
_BAD_NAME = re.compile(r'[<>:"/\\|?*\x00-\x1f\x7f]')


@dataclass(frozen=True)
class Steps:
    """What the steps add to a task: the steps, how their rewards roll up, and the task-level parts made of them."""

    steps: tuple[TaskStep, ...]
    strategy: StepReward
    instruction: str
    agent_timeout_s: float
    verifier_timeout_s: float
    solution: SolutionSpec | None
    extra: dict[str, object]


def _read_text(file: Path, task_dir: Path, what: str) -> str:
    if not file.is_file():
        raise InvalidTaskError(f"{task_dir}: {file.relative_to(task_dir)} is missing; {what}", path=task_dir)
    text = read_text(file, task_dir)
    if not text.strip():
        raise InvalidTaskError(f"{file}: is empty; write the step's instruction in it", path=task_dir)
    return text


def _min_reward(table: Table) -> Mapping[str, float] | None:
    value = table.raw("min_reward")
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return MappingProxyType({"reward": float(value)})
    if isinstance(value, dict) and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value.values()):
        return MappingProxyType({str(k): float(v) for k, v in value.items()})
    raise table.error(
        f"[[steps]] min_reward must be a number or a table of numbers, got {value!r} ({type_name(value)})",
        fix="write e.g. min_reward = 1.0 or min_reward = { tests = 1.0 }",
    )


def _test_uploads(task_tests: Path, step_tests: Path) -> dict[str, Path]:
    """The task's tests/ at /tests, then each file of the step's tests/ over it (Harbor uploads both, the step's
    last, so a step's file replaces the task's of the same name)."""
    uploads: dict[str, Path] = {}
    if task_tests.is_dir():
        uploads[TESTS_DIR] = task_tests
        if step_tests.is_dir():
            for file in sorted(p for p in step_tests.rglob("*") if p.is_file()):
                uploads[f"{TESTS_DIR}/{file.relative_to(step_tests).as_posix()}"] = file
    elif step_tests.is_dir():
        uploads[TESTS_DIR] = step_tests
    return uploads


def _healthcheck(table: Table) -> Healthcheck | None:
    if not table.has("healthcheck"):
        return None
    check = table.table("healthcheck")
    command = check.string("command", required=True) or ""
    found = Healthcheck(
        command=command,
        interval_s=check.number("interval_sec", 5.0, low=0.0, high=3600.0),
        timeout_s=check.seconds("timeout_sec", 30.0),
        start_period_s=check.number("start_period_sec", 0.0, low=0.0, high=86400.0),
        start_interval_s=check.number("start_interval_sec", 5.0, low=0.0, high=3600.0),
        retries=check.integer("retries", 3, low=1, high=1000),
    )
    strange = check.unknown()
    if strange:
        warn(table.file, f"[{check.section}] unknown keys {', '.join(sorted(strange))} are ignored")
    return found


def artifact_sources(table: Table, key: str = "artifacts") -> list[str]:
    """The sandbox paths of an ``artifacts`` list (Harbor's: a path, or ``{ source = ..., destination = ... }``)."""
    value = table.raw(key)
    if value is None:
        return []
    where = table.label(key)
    if not isinstance(value, list):
        raise table.error(f"{where} must be a list of paths, got {type_name(value)}", fix='write e.g. ["/app/out.txt"]')
    sources: list[str] = []
    for entry in value:
        source = entry.get("source") if isinstance(entry, dict) else entry
        service = entry.get("service") if isinstance(entry, dict) else None
        if not isinstance(source, str) or not source or "\x00" in source or ".." in source.split("/"):
            raise table.error(
                f"{where}: {entry!r} is not a path without '..' (or a table with one as source)",
                fix='write e.g. "/app/out.txt" or { source = "/app/out.txt" }',
            )
        if service not in (None, "main"):
            warn(table.file, f"{where}: {source} of service {service!r} is not recorded (sandrl runs one container)")
            continue
        sources.append(source)
    return sources


def _step_solution(step_dir: Path, task_dir: Path, env: Mapping[str, str]) -> SolutionSpec | None:
    """The step's solve.sh, else the task's (Harbor's oracle falls back to it)."""
    for directory in (step_dir / "solution", task_dir / "solution"):
        if (directory / "solve.sh").is_file():
            return SolutionSpec(
                command="bash /solution/solve.sh",
                uploads=MappingProxyType({"/solution": directory}),
                env=MappingProxyType(dict(env)),
                script=directory / "solve.sh",
            )
    return None


def _solution(steps: tuple[TaskStep, ...], env: Mapping[str, str]) -> SolutionSpec | None:
    """Every step's solution in order, as one command: what ``run_solution`` of the whole task runs."""
    solved = [step for step in steps if step.solution is not None]
    if not solved:
        return None
    lines = []
    for step in solved:
        # Each step's solution/ is put at /solution before its solve.sh runs, as the oracle does per step.
        lines.append(
            f"find /solution -mindepth 1 -maxdepth 1 ! -name .sandrl-steps -exec rm -rf {{}} + && "
            f"cp -a {SOLUTIONS}/{step.name}/. /solution/ && bash /solution/solve.sh"
        )
    uploads = {f"{SOLUTIONS}/{s.name}": s.solution.uploads["/solution"] for s in solved if s.solution is not None}
    return SolutionSpec(
        command=" && \\\n".join(lines), uploads=MappingProxyType(uploads), env=MappingProxyType(dict(env))
    )


def load_steps(
    task_dir: Path,
    top: Table,
    config_file: Path,
    *,
    agent_timeout_s: float,
    verifier: VerifierSpec,
    solution_env: Mapping[str, str],
    keys: Mapping[str, frozenset[str]],
) -> Steps | None:
    """The ``[[steps]]`` of a Harbor task, or None for a single-step task.

    ``verifier`` is the task-level ``[verifier]`` (timeout, env, reward key) the steps build on;
    ``keys`` the Harbor keys of each table (``steps``, ``agent``, ``verifier``), kept in ``extra``.
    """
    entries = top.raw("steps")
    strategy_value = top.string("multi_step_reward_strategy")
    if entries is None or entries == []:
        return None
    if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
        raise top.error("steps must be [[steps]] tables", fix='write [[steps]] followed by name = "..." per step')
    strategy: StepReward = "mean"
    if strategy_value is not None:
        if strategy_value not in STRATEGIES:
            raise top.error(f"multi_step_reward_strategy must be mean or final, got {strategy_value!r}", fix=None)
        strategy = "final" if strategy_value == "final" else "mean"

    task_tests = task_dir / "tests"
    task_artifacts = artifact_sources(top)
    steps: list[TaskStep] = []
    seen: set[str] = set()
    extra: dict[str, object] = {}
    unknown: dict[str, object] = {}
    for number, entry in enumerate(entries, 1):
        table = config_table(entry, file=config_file, section=f"steps.{number}", task=task_dir)
        name = table.string("name", required=True) or ""
        if not name.strip() or name in (".", "..") or name.endswith((".", " ")) or _BAD_NAME.search(name):
            raise table.error(f"[[steps]] name {name!r} is not a portable directory name", fix="use e.g. 01-setup")
        if name.casefold() in seen:
            raise table.error(f"[[steps]] name {name!r} is used twice", fix="give every step its own name")
        seen.add(name.casefold())
        step_dir = task_dir / STEPS_DIR / name
        instruction = _read_text(
            step_dir / "instruction.md", task_dir, f"each step of a multi-step task has its instruction ({name})"
        )
        agent = table.table("agent")
        step_verifier = table.table("verifier")
        if agent.string("user") not in (None, "root") or step_verifier.string("user") not in (None, "root"):
            warn(config_file, f"[[steps]] {name}: a user other than root: sandrl runs every command as root")
        step_tests = step_dir / "tests"
        if not (step_tests / "test.sh").is_file() and not (task_tests / "test.sh").is_file():
            raise InvalidTaskError(
                f"{task_dir}: step {name} has no test script; add {STEPS_DIR}/{name}/tests/test.sh or tests/test.sh",
                path=task_dir,
            )
        workdir = step_dir / "workdir"
        own_artifacts = [a for a in artifact_sources(table) if a not in task_artifacts]
        steps.append(
            TaskStep(
                name=name,
                instruction=instruction,
                verifier=VerifierSpec(
                    command=TEST_COMMAND,
                    timeout_s=step_verifier.seconds("timeout_sec", verifier.timeout_s),
                    reward="reward-file",
                    reward_key=verifier.reward_key,
                    tests_dir=step_tests if step_tests.is_dir() else (task_tests if task_tests.is_dir() else None),
                    uploads=MappingProxyType(_test_uploads(task_tests, step_tests)),
                    env=MappingProxyType({**verifier.env, **step_verifier.env("env")}),
                ),
                agent_timeout_s=agent.seconds("timeout_sec", agent_timeout_s),
                solution=_step_solution(step_dir, task_dir, solution_env),
                workdir_files=workdir if workdir.is_dir() else None,
                min_reward=_min_reward(table),
                healthcheck=_healthcheck(table),
                artifacts=(*task_artifacts, *own_artifacts, ARTIFACTS_DIR),
            )
        )
        for part, allowed in ((table, keys["steps"]), (agent, keys["agent"]), (step_verifier, keys["verifier"])):
            section = f"steps.{number}."
            kept, strange = part.keep(allowed), part.unknown()
            extra.update({f"steps.{name}." + k.removeprefix(section): v for k, v in kept.items()})
            unknown.update({f"steps.{name}." + k.removeprefix(section): v for k, v in strange.items()})
    if unknown:
        warn(
            config_file,
            f"unknown keys {', '.join(sorted(unknown))} are kept in Task.extra but not acted on; "
            "check their spelling against Harbor's [[steps]] reference",
        )
    extra.update(unknown)
    done = tuple(steps)
    instruction = "\n\n".join(
        [f"This task has {len(done)} steps, given to the agent one at a time, each checked before the next."]
        + [f"## Step {k} of {len(done)}: {step.name}\n\n{step.instruction.strip()}" for k, step in enumerate(done, 1)]
    )
    solution = _solution(done, solution_env)
    return Steps(
        steps=done,
        strategy=strategy,
        instruction=instruction + "\n",
        agent_timeout_s=sum(step.agent_timeout_s for step in done),
        verifier_timeout_s=sum(step.verifier.timeout_s for step in done),
        solution=solution,
        extra=extra,
    )
