"""Terminal-Bench 1 task directories, read as that harness reads them.

::

    my-task/
    ├── task.yaml            instruction (or descriptions), timeouts, parser_name, metadata
    ├── Dockerfile           the machine (docker-compose.yaml alongside is recorded, not run)
    ├── run-tests.sh         runs the tests (optional: plain pytest of tests/test_outputs.py)
    ├── tests/               written to /tests at verify time, with run-tests.sh
    └── solution.sh          the oracle (or solution.yaml: a list of commands)

The harness runs ``bash /tests/run-tests.sh`` with ``TEST_DIR=/tests`` and parses its output with
the task's ``parser_name``: ``pytest`` (the default) reads pytest's "short test summary info", so
run-tests.sh uses ``pytest -rA``, and the task passes when every test passed; ``swebench`` (the
SWE-bench adapter's tasks, whose run-tests.sh grades with SWE-bench's harness) reads the block
between ``SWEBench results starts here`` and ``SWEBench results ends here``, and the task passes
when it is ``PASSED``. Other parsers (swelancer, mlebench, sweperf) are refused.

Default timeouts are those Harbor's Terminal-Bench adapter uses (360 s for the agent, 60 s for the
tests).
"""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

import yaml

from sandrl.errors import InvalidTaskError
from sandrl.tasks.dockerfile import read_dockerfile
from sandrl.tasks.fields import config_table, read_text, warn
from sandrl.tasks.harbor import DEFAULT_WORKDIR
from sandrl.tasks.task import TESTS_DIR, EnvironmentSpec, RewardSource, SolutionSpec, Task, VerifierSpec
from sandrl.toml_config import Table, type_name

CONFIG = "task.yaml"
DEFAULT_AGENT_TIMEOUT_S = 360.0
DEFAULT_TEST_TIMEOUT_S = 60.0
SUPPORTED_PARSERS: dict[str, RewardSource] = {"pytest": "pytest-summary", "swebench": "swebench-log"}
"""Terminal-Bench's ``parser_name`` values sandrl reads, and how."""

_METADATA_KEYS = (
    "author_name",
    "author_email",
    "difficulty",
    "category",
    "tags",
    "estimated_duration_sec",
    "expert_time_estimate_min",
    "junior_time_estimate_min",
)
# Known Terminal-Bench keys that only matter to its own tmux/asciinema harness.
_HARNESS_ONLY_KEYS = ("disable_asciinema", "test_scripts", "env_name")


def is_terminal_bench_dir(path: Path) -> bool:
    return (path / CONFIG).is_file() or (path / "task.yml").is_file()


def _read_yaml(file: Path, task_dir: Path) -> object:
    text = read_text(file, task_dir)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidTaskError(
            f"{file}: is not valid YAML ({exc}); check the indentation and quote strings that contain ': '",
            path=task_dir,
        ) from exc


def _instruction(top: Table) -> str:
    if top.has("instruction"):
        text = top.string("instruction")
    elif top.has("descriptions"):
        # The older form: a list of {key, description}; the harness uses the "base" one.
        items = top.raw("descriptions")
        if not isinstance(items, list) or not items or not all(isinstance(item, dict) for item in items):
            raise top.error(
                "descriptions must be a non-empty list of {key, description} entries",
                fix="or write instruction: | followed by the text",
            )
        chosen = next((item for item in items if item.get("key") == "base"), items[0])
        text = chosen.get("description")
        if not isinstance(text, str):
            raise top.error(
                f"descriptions: the description of {chosen.get('key')!r} must be a string, got {type_name(text)}",
                fix=None,
            )
    else:
        raise top.error("instruction is missing", fix="add instruction: | followed by what the agent must do")
    if not text or not text.strip():
        raise top.error("instruction is empty", fix="write what the agent must do")
    return text


def _solution(task_dir: Path) -> SolutionSpec | None:
    script = task_dir / "solution.sh"
    if script.is_file():
        return SolutionSpec(
            command="bash /solution/solution.sh",
            uploads=MappingProxyType({"/solution/solution.sh": script}),
            script=script,
        )
    steps_file = task_dir / "solution.yaml"
    if not steps_file.is_file():
        return None
    steps = _read_yaml(steps_file, task_dir)
    if not isinstance(steps, list) or not all(isinstance(step, dict) for step in steps):
        raise InvalidTaskError(
            f"{steps_file}: must be a list of entries with a command (e.g. '- command: make')", path=task_dir
        )
    lines: list[str] = []
    for number, step in enumerate(steps, 1):
        command = step.get("command")
        if not isinstance(command, str):
            raise InvalidTaskError(f"{steps_file}: entry {number} has no command string", path=task_dir)
        if step.get("append_enter", True) is False:
            # Keystrokes typed into a live terminal (an editor, Ctrl-C) have no non-interactive equivalent.
            warn(
                steps_file,
                f"entry {number} sends keystrokes without Enter ({command!r}); the solution cannot be replayed "
                "as a script, so this task has no oracle here",
            )
            return None
        lines.append(command)
    # Commands were typed into one shell, which kept going after a failure; so does this script.
    return SolutionSpec(command="\n".join(lines) + "\n")


def load_terminal_bench_task(task_dir: Path) -> Task:
    """Load one Terminal-Bench 1 task directory; raises :class:`~sandrl.errors.InvalidTaskError` if malformed."""
    task_dir = Path(task_dir)
    config_file = task_dir / CONFIG
    if not config_file.is_file() and (task_dir / "task.yml").is_file():
        config_file = task_dir / "task.yml"
    if not config_file.is_file():
        raise InvalidTaskError(f"{task_dir}: {CONFIG} is missing; every Terminal-Bench task has one", path=task_dir)
    top = config_table(_read_yaml(config_file, task_dir), file=config_file, task=task_dir)

    instruction = _instruction(top)
    parser = top.string("parser_name", "pytest") or "pytest"
    reward = SUPPORTED_PARSERS.get(parser)
    if reward is None:
        raise top.error(
            f"parser_name {parser!r} is not supported",
            fix=f"sandrl reads {', '.join(SUPPORTED_PARSERS)} output; convert the task to Harbor for another verifier",
        )
    agent_timeout = top.seconds("max_agent_timeout_sec", DEFAULT_AGENT_TIMEOUT_S)
    test_timeout = top.seconds("max_test_timeout_sec", DEFAULT_TEST_TIMEOUT_S)
    if top.boolean("run_tests_in_same_shell", False):
        warn(config_file, "run_tests_in_same_shell: sandrl runs the tests in a fresh shell after the agent's")

    metadata: dict[str, object] = {}
    for key in _METADATA_KEYS:
        if top.has(key):
            metadata[key] = top.raw(key)
    if "tags" in metadata:
        top.strings("tags")  # type-check only
    for key in _HARNESS_ONLY_KEYS:
        top.raw(key)
    extra = top.unknown(extra_known=("instruction", "descriptions"))
    if extra:
        warn(
            config_file,
            f"unknown keys {', '.join(sorted(extra))} are kept in Task.extra but not acted on; "
            "check their spelling against Terminal-Bench's task.yaml",
        )

    dockerfile = task_dir / "Dockerfile"
    compose = task_dir / "docker-compose.yaml"
    text: str | None = None
    if dockerfile.is_file():
        text = read_text(dockerfile, task_dir)
    elif not compose.is_file():
        raise InvalidTaskError(
            f"{task_dir}: has no Dockerfile (or docker-compose.yaml); a Terminal-Bench task defines its machine there",
            path=task_dir,
        )
    facts = read_dockerfile(text) if text is not None else None

    tests_dir = task_dir / "tests"
    run_tests = task_dir / "run-tests.sh"
    uploads: dict[str, Path] = {}
    if tests_dir.is_dir():
        uploads[TESTS_DIR] = tests_dir
    if run_tests.is_file():
        uploads[f"{TESTS_DIR}/run-tests.sh"] = run_tests
        command = f"bash {TESTS_DIR}/run-tests.sh"
    elif (tests_dir / "test_outputs.py").is_file():
        # What run-tests.sh is optional for: plain pytest of the task's test file.
        command = f"python3 -m pytest -rA {TESTS_DIR}/test_outputs.py"
    else:
        raise InvalidTaskError(
            f"{task_dir}: has neither run-tests.sh nor tests/test_outputs.py, so there is nothing to verify with",
            path=task_dir,
        )

    return Task(
        id=task_dir.name,
        name=task_dir.name,
        source=task_dir,
        format="terminal-bench",
        instruction=instruction,
        environment=EnvironmentSpec(
            dockerfile=dockerfile if text is not None else None,
            dockerfile_text=text,
            context_dir=task_dir,
            compose_file=compose if compose.is_file() else None,
            base_image=facts.base_image if facts else None,
            workdir=(facts.workdir if facts else None) or DEFAULT_WORKDIR,
        ),
        verifier=VerifierSpec(
            command=command,
            timeout_s=test_timeout,
            reward=reward,
            tests_dir=tests_dir if tests_dir.is_dir() else None,
            uploads=MappingProxyType(uploads),
            env=MappingProxyType({"TEST_DIR": TESTS_DIR}),
        ),
        solution=_solution(task_dir),
        agent_timeout_s=agent_timeout,
        metadata=MappingProxyType(metadata),
        extra=MappingProxyType(extra),
    )
