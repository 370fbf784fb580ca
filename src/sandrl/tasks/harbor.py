"""Harbor task directories, read as Harbor writes them.

::

    my-task/
    ├── instruction.md          what the agent is told
    ├── task.toml               [metadata] [task] [agent] [verifier] [environment] [solution]
    ├── environment/Dockerfile  the machine (or [environment] docker_image)
    ├── tests/test.sh           writes /logs/verifier/reward.txt or reward.json
    └── solution/solve.sh       the oracle (optional)

Defaults are Harbor's (timeouts 600 s, 1 CPU, 2048 MB, 10240 MB storage, internet allowed). The
deprecated spellings ``memory = "4G"`` and ``storage = "10G"`` are read too. Keys sandrl does not
know are kept in :attr:`Task.extra` and reported with a :class:`~sandrl.tasks.fields.TaskWarning`.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from types import MappingProxyType

from sandrl.errors import InvalidTaskError
from sandrl.tasks.dockerfile import read_dockerfile
from sandrl.tasks.fields import Table, warn
from sandrl.tasks.task import TESTS_DIR, EnvironmentSpec, SolutionSpec, Task, VerifierSpec

CONFIG = "task.toml"
INSTRUCTION = "instruction.md"

DEFAULT_TIMEOUT_S = 600.0
DEFAULT_WORKDIR = "/app"
"""When neither task.toml nor the Dockerfile says: the directory Harbor and Terminal-Bench tasks use."""

# Keys Harbor defines that sandrl reads or can safely ignore, per table. Anything else is "unknown".
_IGNORED_TOP = {"version", "schema_version", "source"}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT])i?B?\s*$", re.IGNORECASE)
_SIZE_MB = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


def is_harbor_dir(path: Path) -> bool:
    return (path / CONFIG).is_file()


def _read_toml(file: Path, task_dir: Path) -> dict[str, object]:
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidTaskError(f"{file}: cannot be read ({exc})", path=task_dir) from exc
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
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidTaskError(f"{file}: cannot be read ({exc})", path=task_dir) from exc
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
        try:
            text = dockerfile.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidTaskError(f"{dockerfile}: cannot be read ({exc})", path=task_dir) from exc
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
    table.raw("gpu_types")
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
        allow_internet=table.boolean("allow_internet", True),
        env=MappingProxyType(table.env("env")),
        workdir=workdir,
        build_timeout_s=table.seconds("build_timeout_sec", DEFAULT_TIMEOUT_S),
    )


def _check_user(table: Table, config_file: Path) -> None:
    user = table.string("user")
    if user not in (None, "root"):
        warn(config_file, f"[{table.section}] user = {user!r}: sandrl runs every command as root")


def load_harbor_task(task_dir: Path) -> Task:
    """Load one Harbor task directory; raises :class:`~sandrl.errors.InvalidTaskError` if malformed."""
    task_dir = Path(task_dir)
    config_file = task_dir / CONFIG
    if not config_file.is_file():
        raise InvalidTaskError(f"{task_dir}: {CONFIG} is missing; every Harbor task has one", path=task_dir)
    top = Table(_read_toml(config_file, task_dir), file=config_file, task=task_dir)

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
    _check_user(verifier, config_file)

    solution_table = top.table("solution")
    solution_env = solution_table.env("env")

    environment_table = top.table("environment")
    environment = _environment(task_dir, environment_table, config_file)
    instruction = _instruction(task_dir)

    tests_dir = task_dir / "tests"
    if not (tests_dir / "test.sh").is_file():
        raise InvalidTaskError(
            f"{task_dir}: tests/test.sh is missing; it is the verifier's entry point and writes "
            "/logs/verifier/reward.txt (a number) or /logs/verifier/reward.json",
            path=task_dir,
        )

    solution: SolutionSpec | None = None
    solve = task_dir / "solution" / "solve.sh"
    if solve.is_file():
        solution = SolutionSpec(
            command="bash /solution/solve.sh",
            uploads=MappingProxyType({"/solution": task_dir / "solution"}),
            env=MappingProxyType(solution_env),
            script=solve,
        )

    extra: dict[str, object] = {}
    tables = {
        "task": task_table,
        "agent": agent,
        "verifier": verifier,
        "solution": solution_table,
        "environment": environment_table,
    }
    extra.update(top.unknown(extra_known={*tables, "metadata", *_IGNORED_TOP}))
    for table in tables.values():
        extra.update(table.unknown())
    if extra:
        warn(
            config_file,
            f"unknown keys {', '.join(sorted(extra))} are kept in Task.extra but not acted on; "
            "check their spelling against Harbor's task.toml reference",
        )

    return Task(
        id=task_dir.name,
        name=name,
        source=task_dir,
        format="harbor",
        instruction=instruction,
        environment=environment,
        verifier=VerifierSpec(
            # Harbor makes the script executable and runs it, so its shebang picks the shell.
            command=f"chmod +x {TESTS_DIR}/test.sh && {TESTS_DIR}/test.sh",
            timeout_s=verifier_timeout,
            reward="reward-file",
            tests_dir=tests_dir,
            uploads=MappingProxyType({TESTS_DIR: tests_dir}),
            env=MappingProxyType(verifier_env),
        ),
        solution=solution,
        agent_timeout_s=agent_timeout,
        metadata=MappingProxyType(metadata),
        extra=MappingProxyType(extra),
    )
