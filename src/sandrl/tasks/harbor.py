"""Harbor task directories, read as Harbor writes them.

::

    my-task/
    ├── instruction.md          what the agent is told
    ├── task.toml               [metadata] [task] [agent] [verifier] [environment] [solution]
    ├── environment/Dockerfile  the machine (or [environment] docker_image)
    ├── tests/test.sh           writes /logs/verifier/reward.txt or reward.json
    └── solution/solve.sh       the oracle (optional)

A multi-step task (``[[steps]]`` and ``steps/<name>/``) is read by :mod:`sandrl.tasks.harbor_steps`.

Defaults are Harbor's (timeouts 600 s, 1 CPU, 2048 MB, 10240 MB storage, internet allowed). The
deprecated spellings ``memory = "4G"`` and ``storage = "10G"`` are read too, and so is
``[environment] network_mode`` (``public``, ``no-network``; ``allowlist`` runs with the network, with
a warning) over the older ``allow_internet``.

Every key of Harbor's task config (:data:`HARBOR_KEYS`, from ``harbor.models.task.config``) is
accepted. Those sandrl does not act on (``artifacts`` of a single-step task, ``[environment] mcp_servers``
and ``healthcheck``, ``[agent] network_mode``...) are kept in :attr:`Task.extra` under their dotted path
without a warning, unless ignoring them changes what the task measures (``gpus``, a non-root
``user``, a separate verifier environment), which is warned about. Keys Harbor does not define are
kept in :attr:`Task.extra` too and reported with a :class:`~sandrl.tasks.fields.TaskWarning`.

sandrl's own keys: ``[agent] command_timeout_sec`` (the LLM agent's per-command timeout) and
``[verifier] reward_key`` (which key of a several-key ``reward.json`` is the reward; see
:mod:`sandrl.tasks.verify`).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

from sandrl.errors import InvalidTaskError
from sandrl.tasks.dockerfile import read_dockerfile
from sandrl.tasks.fields import config_table, read_text, warn
from sandrl.tasks.harbor_steps import load_steps
from sandrl.tasks.task import TESTS_DIR, EnvironmentSpec, SolutionSpec, Task, VerifierSpec
from sandrl.toml_config import Table

CONFIG = "task.toml"
INSTRUCTION = "instruction.md"

DEFAULT_TIMEOUT_S = 600.0
DEFAULT_WORKDIR = "/app"
"""When neither task.toml nor the Dockerfile says: the directory Harbor and Terminal-Bench tasks use."""

HARBOR_KEYS: dict[str, frozenset[str]] = {
    "": frozenset(
        {
            "schema_version",
            "version",
            "source",
            "task",
            "metadata",
            "verifier",
            "agent",
            "environment",
            "solution",
            "multi_step_reward_strategy",
            "steps",
            "artifacts",
        }
    ),
    "task": frozenset({"name", "version", "description", "authors", "keywords"}),
    "agent": frozenset({"timeout_sec", "user", "network_mode", "allowed_hosts"}),
    "verifier": frozenset(
        {"timeout_sec", "env", "user", "environment_mode", "environment", "collect", "network_mode", "allowed_hosts"}
    ),
    "solution": frozenset({"env"}),
    "environment": frozenset(
        {
            "build_timeout_sec",
            "docker_image",
            "os",
            "cpus",
            "memory_mb",
            "storage_mb",
            "gpus",
            "gpu_types",
            "tpu",
            "mcp_servers",
            "env",
            "skills_dir",
            "healthcheck",
            "workdir",
            "allow_internet",
            "network_mode",
            "allowed_hosts",
            "memory",
            "storage",
        }
    ),
    "steps": frozenset({"name", "agent", "verifier", "min_reward", "healthcheck", "artifacts"}),
}
"""Every key of Harbor's ``task.toml`` per table (``""`` is the top level; ``steps`` one ``[[steps]]``
entry), as Harbor 0.26's task config model (schema 1.4) defines them."""
SANDRL_KEYS: dict[str, frozenset[str]] = {"agent": frozenset({"command_timeout_sec"})}
"""sandrl's own keys, kept in :attr:`Task.extra` for the code that reads them (the LLM agent)."""
_DROPPED_TOP = ("version", "schema_version", "source")
"""Harbor keys about the file itself, not the task: read and dropped."""
NETWORK_MODES = ("public", "no-network", "allowlist")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT])i?B?\s*$", re.IGNORECASE)
_SIZE_MB = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


def is_harbor_dir(path: Path) -> bool:
    return (path / CONFIG).is_file()


def _read_toml(file: Path, task_dir: Path) -> dict[str, object]:
    text = read_text(file, task_dir)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidTaskError(
            f"{file}: is not valid TOML ({exc}); check quotes, brackets and that every table is [section]",
            path=task_dir,
        ) from exc


def _size_mb(table: Table, new_key: str, old_key: str, default: int) -> int:
    """``memory_mb = 4096``, or the deprecated ``memory = "4G"``."""
    if table.has(new_key) or not table.has(old_key):
        table.raw(old_key)  # both given: the _mb key wins, as in Harbor
        return table.integer(new_key, default, low=16, high=1 << 24)
    value = table.raw(old_key)
    match = _SIZE.match(value) if isinstance(value, str) else None
    if match is None:
        raise table.error(
            f'[environment] {old_key} must be a size such as "4G" or "512M", got {value!r}',
            fix=f"or write {new_key} = 4096",
        )
    return max(1, round(float(match.group(1)) * _SIZE_MB[match.group(2).upper()]))


def _instruction(task_dir: Path) -> str:
    file = task_dir / INSTRUCTION
    if not file.is_file():
        raise InvalidTaskError(
            f"{task_dir}: {INSTRUCTION} is missing; a Harbor task tells the agent what to do in {INSTRUCTION}",
            path=task_dir,
        )
    text = read_text(file, task_dir)
    if not text.strip():
        raise InvalidTaskError(f"{file}: is empty; write the task's instruction in it", path=task_dir)
    return text


def _environment(task_dir: Path, table: Table, config_file: Path) -> EnvironmentSpec:
    env_dir = task_dir / "environment"
    dockerfile = env_dir / "Dockerfile"
    compose = env_dir / "docker-compose.yaml"
    docker_image = table.string("docker_image")
    text: str | None = None
    if dockerfile.is_file():
        text = read_text(dockerfile, task_dir)
    elif docker_image is None and not compose.is_file():
        raise InvalidTaskError(
            f"{task_dir}: has no environment; add environment/Dockerfile or set [environment] docker_image in {CONFIG}",
            path=task_dir,
        )
    facts = read_dockerfile(text) if text is not None else None
    workdir = table.string("workdir") or (facts.workdir if facts else None) or DEFAULT_WORKDIR
    if not workdir.startswith("/"):
        raise table.error(f"[environment] workdir must be an absolute path, got {workdir!r}", fix=None)

    gpus = table.integer("gpus", 0, low=0, high=1024)
    if gpus:
        warn(config_file, f"[environment] gpus = {gpus} cannot be honoured by sandrl's sandboxes; running without")
    os_name = table.string("os")
    if os_name is not None and os_name.lower() != "linux":
        warn(config_file, f"[environment] os = {os_name!r}: sandrl runs Linux sandboxes only")

    return EnvironmentSpec(
        dockerfile=dockerfile if text is not None else None,
        dockerfile_text=text,
        context_dir=env_dir if env_dir.is_dir() else None,
        compose_file=compose if compose.is_file() else None,
        docker_image=docker_image,
        base_image=facts.base_image if facts else docker_image,
        cpus=table.number("cpus", 1.0, low=0.01, high=1024),
        memory_mb=_size_mb(table, "memory_mb", "memory", 2048),
        storage_mb=_size_mb(table, "storage_mb", "storage", 10240),
        allow_internet=_network(table, config_file),
        env=MappingProxyType(table.env("env")),
        workdir=workdir,
        build_timeout_s=table.seconds("build_timeout_sec", DEFAULT_TIMEOUT_S),
    )


def _network(table: Table, config_file: Path) -> bool:
    """Whether the sandbox has the network: ``network_mode`` when set (Harbor's current key), else
    the deprecated ``allow_internet``."""
    allow = table.boolean("allow_internet", True)
    mode = table.string("network_mode")
    if mode is None:
        return allow
    if mode not in NETWORK_MODES:
        raise table.error(
            f"[{table.section}] network_mode must be one of {', '.join(NETWORK_MODES)}, got {mode!r}", fix=None
        )
    if mode == "allowlist":
        warn(
            config_file,
            f"[{table.section}] network_mode = 'allowlist': sandrl's sandboxes cannot limit the network to "
            "allowed_hosts; running with the network",
        )
    return mode != "no-network"


def _check_user(table: Table, config_file: Path) -> None:
    user = table.string("user")
    if user not in (None, "root"):
        warn(config_file, f"[{table.section}] user = {user!r}: sandrl runs every command as root")


def _check_verifier_environment(table: Table, config_file: Path) -> None:
    # Looked at, not read: the keys stay in Task.extra as they are.
    if table.data.get("environment_mode") == "separate" or table.data.get("environment") is not None:
        warn(
            config_file,
            f"[{table.section}] asks for a separate verifier environment: sandrl runs the tests in the agent's sandbox",
        )


def load_harbor_task(task_dir: Path) -> Task:
    """Load one Harbor task directory; raises :class:`~sandrl.errors.InvalidTaskError` if malformed."""
    task_dir = Path(task_dir)
    config_file = task_dir / CONFIG
    if not config_file.is_file():
        raise InvalidTaskError(f"{task_dir}: {CONFIG} is missing; every Harbor task has one", path=task_dir)
    top = config_table(_read_toml(config_file, task_dir), file=config_file, task=task_dir)

    task_table = top.table("task")
    name = task_table.string("name") or task_dir.name
    task_info: dict[str, object] = {}
    for key in ("description", "authors", "keywords"):
        if task_table.has(key):
            task_info[key] = task_table.raw(key)

    metadata_value = top.raw("metadata")
    if metadata_value is not None and not isinstance(metadata_value, dict):
        raise top.error("[metadata] must be a table", fix="write [metadata] followed by key = value lines")
    metadata: dict[str, object] = dict(metadata_value or {})
    metadata.update(task_info)

    agent = top.table("agent")
    agent_timeout = agent.seconds("timeout_sec", DEFAULT_TIMEOUT_S)
    agent.raw("setup_timeout_sec")
    _check_user(agent, config_file)

    verifier = top.table("verifier")
    verifier_timeout = verifier.seconds("timeout_sec", DEFAULT_TIMEOUT_S)
    verifier_env = verifier.env("env")
    reward_key = verifier.string("reward_key")
    _check_user(verifier, config_file)
    _check_verifier_environment(verifier, config_file)

    solution_table = top.table("solution")
    solution_env = solution_table.env("env")

    environment_table = top.table("environment")
    environment = _environment(task_dir, environment_table, config_file)
    tests_dir = task_dir / "tests"
    task_verifier = VerifierSpec(
        # Harbor makes the script executable and runs it, so its shebang picks the shell.
        command=f"chmod +x {TESTS_DIR}/test.sh && {TESTS_DIR}/test.sh",
        timeout_s=verifier_timeout,
        reward="reward-file",
        reward_key=reward_key,
        tests_dir=tests_dir,
        uploads=MappingProxyType({TESTS_DIR: tests_dir}),
        env=MappingProxyType(verifier_env),
    )
    steps = load_steps(
        task_dir,
        top,
        config_file,
        agent_timeout_s=agent_timeout,
        verifier=task_verifier,
        solution_env=solution_env,
        keys=HARBOR_KEYS,
    )

    solution: SolutionSpec | None = None
    if steps is not None:
        # Every step's instruction, verifier and solution (harbor_steps); the task-level ones stand for all.
        instruction = steps.instruction
        task_verifier = replace(
            task_verifier,
            command="\n".join(step.verifier.command for step in steps.steps),
            timeout_s=steps.verifier_timeout_s,
            tests_dir=tests_dir if tests_dir.is_dir() else None,
            uploads=MappingProxyType({}),
        )
        agent_timeout = steps.agent_timeout_s
        solution = steps.solution
    else:
        instruction = _instruction(task_dir)
        if not (tests_dir / "test.sh").is_file():
            raise InvalidTaskError(
                f"{task_dir}: tests/test.sh is missing; it is the verifier's entry point and writes "
                "/logs/verifier/reward.txt (a number) or /logs/verifier/reward.json",
                path=task_dir,
            )
        solve = task_dir / "solution" / "solve.sh"
        if solve.is_file():
            solution = SolutionSpec(
                command="bash /solution/solve.sh",
                uploads=MappingProxyType({"/solution": task_dir / "solution"}),
                env=MappingProxyType(solution_env),
                script=solve,
            )

    tables = {
        "task": task_table,
        "agent": agent,
        "verifier": verifier,
        "solution": solution_table,
        "environment": environment_table,
    }
    for key in _DROPPED_TOP:
        top.raw(key)
    extra = top.keep(HARBOR_KEYS[""] - {*tables, "metadata"})
    extra.update(steps.extra if steps is not None else {})
    for section, table in tables.items():
        extra.update(table.keep(HARBOR_KEYS[section] | SANDRL_KEYS.get(section, frozenset())))
    unknown = top.unknown(extra_known={*tables, "metadata"})
    for table in tables.values():
        unknown.update(table.unknown())
    extra.update(unknown)
    if unknown:
        warn(
            config_file,
            f"unknown keys {', '.join(sorted(unknown))} are kept in Task.extra but not acted on; "
            "check their spelling against Harbor's task.toml reference",
        )

    return Task(
        id=task_dir.name,
        name=name,
        source=task_dir,
        format="harbor",
        instruction=instruction,
        environment=environment,
        verifier=task_verifier,
        solution=solution,
        agent_timeout_s=agent_timeout,
        metadata=MappingProxyType(metadata),
        extra=MappingProxyType(extra),
        steps=steps.steps if steps is not None else (),
        step_reward=steps.strategy if steps is not None else "mean",
    )
