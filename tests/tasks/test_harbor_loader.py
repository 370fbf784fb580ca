"""The Harbor loader on real-shaped task directories, odd-but-valid ones and broken ones."""

from __future__ import annotations

import os
import re
import resource
import shutil
import warnings
from pathlib import Path

import pytest

from sandrl.errors import InvalidTaskError
from sandrl.tasks import TaskWarning, load_harbor_task
from sandrl.tasks.fields import MAX_TASK_FILE_CHARS

from .conftest import FIXTURES

HELLO = FIXTURES / "harbor" / "hello-file"
ODD = FIXTURES / "harbor" / "odd-but-valid"


def test_hello_file_reads_every_section() -> None:
    task = load_harbor_task(HELLO)
    assert (task.id, task.name, task.format, task.source) == ("hello-file", "sandrl/hello-file", "harbor", HELLO)
    assert task.instruction.startswith("Create the file `/app/hello.txt`")
    assert task.agent_timeout_s == 120.0
    assert task.metadata["difficulty"] == "easy"
    assert task.metadata["tags"] == ["trivial", "files"]
    assert task.metadata["keywords"] == ["trivial", "files"]  # from [task]
    assert dict(task.extra) == {}

    env = task.environment
    assert env.dockerfile == HELLO / "environment" / "Dockerfile"
    assert env.dockerfile_text is not None and "WORKDIR /app" in env.dockerfile_text
    assert env.context_dir == HELLO / "environment"
    assert env.base_image == "python:3.11-slim"  # FROM base, and base is FROM python:3.11-slim
    assert env.workdir == "/app"
    assert (env.cpus, env.memory_mb, env.storage_mb, env.allow_internet) == (2.0, 1024, 4096, False)
    assert env.build_timeout_s == 300.0
    assert dict(env.env) == {"LANG": "C.UTF-8"}

    verifier = task.verifier
    assert verifier.reward == "reward-file"
    assert verifier.timeout_s == 30.0
    assert verifier.tests_dir == HELLO / "tests"
    assert dict(verifier.uploads) == {"/tests": HELLO / "tests"}
    assert verifier.env["SECRET"] == "${SANDRL_TEST_SECRET:-no-secret}"  # resolved at run time, not load time

    assert task.solution is not None
    assert task.solution.script == HELLO / "solution" / "solve.sh"
    assert dict(task.solution.uploads) == {"/solution": HELLO / "solution"}
    assert dict(task.solution.env) == {"GREETING": "Hello, world!"}


def test_odd_but_valid_task_loads_and_warns_about_unknown_keys() -> None:
    with pytest.warns(TaskWarning, match=r"unknown keys difficulty_note, environment\.gpus_per_node"):
        task = load_harbor_task(ODD)
    assert dict(task.extra) == {
        "difficulty_note": "top-level key Harbor does not define",
        "environment.gpus_per_node": 8,
    }
    env = task.environment
    assert env.dockerfile is None and env.docker_image == "ghcr.io/example/odd:latest"
    assert env.base_image == "ghcr.io/example/odd:latest"
    assert (env.cpus, env.memory_mb, env.storage_mb) == (0.5, 1024, 512)  # memory = "1G", storage = "512M"
    assert env.allow_internet is True  # Harbor's default
    assert env.workdir == "/workspace"
    assert dict(env.env) == {"ODD": "yes"}  # [environment.env] table form
    assert (task.agent_timeout_s, task.verifier.timeout_s) == (45.0, 20.0)  # integers accepted
    assert task.solution is None
    assert task.metadata["nested"] == {"level": 2, "items": [1, 2, 3]}


def test_defaults_are_harbors(tmp_path: Path) -> None:
    task_dir = tmp_path / "minimal"
    (task_dir / "tests").mkdir(parents=True)
    (task_dir / "task.toml").write_text("")
    (task_dir / "instruction.md").write_text("Do it.\n")
    (task_dir / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (task_dir / "environment").mkdir()
    (task_dir / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\n")
    task = load_harbor_task(task_dir)
    assert task.agent_timeout_s == task.verifier.timeout_s == task.environment.build_timeout_s == 600.0
    env = task.environment
    assert (env.cpus, env.memory_mb, env.storage_mb, env.allow_internet) == (1.0, 2048, 10240, True)
    assert env.workdir == "/app"  # no WORKDIR anywhere: the Harbor/Terminal-Bench convention


def test_settings_sandrl_cannot_honour_are_warned_about(tmp_path: Path) -> None:
    task_dir = tmp_path / "gpu"
    shutil.copytree(HELLO, task_dir)
    config = task_dir / "task.toml"
    config.write_text(config.read_text() + 'gpus = 2\nos = "windows"\n\n[agent.extra]\n')
    config.write_text(config.read_text().replace("[agent]\n", '[agent]\nuser = "agent"\n'))
    with pytest.warns(TaskWarning) as record:
        load_harbor_task(task_dir)
    messages = "\n".join(str(w.message) for w in record)
    assert "gpus = 2" in messages
    assert "os = 'windows'" in messages
    assert "user = 'agent'" in messages
    assert "agent.extra" in messages


# Every key of Harbor's task config model (harbor.models.task.config, schema 1.4), as a real task writes them.
FULL_HARBOR_TOML = """\
schema_version = "1.4"
source = "registry"
artifacts = ["/app/answer.json", { source = "/app/logs", destination = "logs", exclude = ["*.tmp"] }]

[task]
name = "sandrl/full"
version = "1.2.0"
description = "Every key"
authors = [{ name = "Ada", email = "ada@example.invalid" }]
keywords = ["keys"]

[metadata]
difficulty = "easy"

[verifier]
timeout_sec = 30.0
env = { A = "b" }
user = "root"
environment_mode = "shared"
network_mode = "no-network"
collect = [{ command = "echo hi", service = "main", timeout_sec = 5.0 }]

[agent]
timeout_sec = 60.0
user = "root"
network_mode = "public"
command_timeout_sec = 20

[solution]
env = { B = "c" }

[environment]
build_timeout_sec = 100.0
docker_image = "python:3.12-slim"
os = "linux"
cpus = 1
memory_mb = 1024
storage_mb = 2048
gpus = 0
gpu_types = ["H100"]
network_mode = "no-network"
skills_dir = "/skills"
workdir = "/app"
env = { C = "d" }
mcp_servers = [{ name = "docs", transport = "streamable-http", url = "http://mcp.example.invalid/mcp" }]
healthcheck = { command = "true", interval_sec = 1.0, timeout_sec = 5.0, retries = 2 }
tpu = { type = "v6e", topology = "2x2" }
"""


def test_harbors_whole_key_set_loads_without_warnings(tmp_path: Path) -> None:
    task_dir = tmp_path / "full"
    (task_dir / "tests").mkdir(parents=True)
    (task_dir / "task.toml").write_text(FULL_HARBOR_TOML)
    (task_dir / "instruction.md").write_text("Do it.\n")
    (task_dir / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        task = load_harbor_task(task_dir)
    assert task.environment.allow_internet is False  # network_mode = "no-network"
    assert (task.agent_timeout_s, task.verifier.timeout_s) == (60.0, 30.0)
    extra = dict(task.extra)
    assert extra["artifacts"][0] == "/app/answer.json"
    assert extra["environment.mcp_servers"][0]["name"] == "docs"
    assert extra["environment.healthcheck"]["command"] == "true"
    assert extra["verifier.collect"][0]["command"] == "echo hi"
    assert extra["agent.command_timeout_sec"] == 20  # sandrl's own key, read by the LLM agent
    assert extra["task.version"] == "1.2.0"
    assert {"environment.tpu", "environment.skills_dir", "agent.network_mode", "verifier.environment_mode"} <= set(
        extra
    )


@pytest.mark.parametrize(
    ("edit", "warning"),
    [
        ('network_mode = "allowlist"\nallowed_hosts = ["pypi.org"]', "cannot limit the network"),
        ("[verifier.environment]\ndocker_image = 'grader'", "separate verifier environment"),
    ],
)
def test_harbor_keys_sandrl_cannot_honour_warn(tmp_path: Path, edit: str, warning: str) -> None:
    task_dir = tmp_path / "net"
    shutil.copytree(HELLO, task_dir)
    config = task_dir / "task.toml"
    text = config.read_text().replace("allow_internet = false\n", "")
    if edit.startswith("["):
        text += "\n" + edit + "\n"
    else:
        text = text.replace("[environment]\n", "[environment]\n" + edit + "\n")
    config.write_text(text)
    with pytest.warns(TaskWarning, match=warning):
        task = load_harbor_task(task_dir)
    assert task.environment.allow_internet is True


def test_network_mode_is_checked(tmp_path: Path) -> None:
    task_dir = _broken(tmp_path, ("allow_internet = false", 'network_mode = "offline"'))
    with pytest.raises(InvalidTaskError, match=r"network_mode must be one of public, no-network, allowlist"):
        load_harbor_task(task_dir)


def _broken(tmp_path: Path, *edits: tuple[str, str], remove: str | None = None) -> Path:
    task_dir = tmp_path / "broken"
    shutil.copytree(HELLO, task_dir)
    config = task_dir / "task.toml"
    for old, new in edits:
        assert old in config.read_text()
        config.write_text(config.read_text().replace(old, new, 1))
    if remove is not None:
        target = task_dir / remove
        target.unlink() if target.is_file() else shutil.rmtree(target)
    return task_dir


TOP = 'version = "1.0"'
METADATA = """[metadata]
author_name = "Ada"
author_email = "ada@example.invalid"
difficulty = "easy"
category = "programming"
tags = ["trivial", "files"]
"""


@pytest.mark.parametrize(
    ("edits", "expected"),
    [
        (
            [("timeout_sec = 30.0", 'timeout_sec = "ten"')],
            r"\[verifier\] timeout_sec must be a number of seconds > 0, got 'ten'",
        ),
        (
            [("timeout_sec = 120.0", "timeout_sec = -1")],
            r"\[agent\] timeout_sec must be a number of seconds > 0, got -1",
        ),
        ([("cpus = 2", 'cpus = "two"')], r"\[environment\] cpus must be a number between"),
        ([("memory_mb = 1024", "memory_mb = 10.5")], r"\[environment\] memory_mb must be a whole number"),
        (
            [("allow_internet = false", 'allow_internet = "no"')],
            r"allow_internet must be true or false.*without quotes",
        ),
        ([('env = { LANG = "C.UTF-8" }', "env = { LANG = 8 }")], r"the value of LANG must be a string, got 8"),
        ([('env = { LANG = "C.UTF-8" }', 'env = ["LANG"]')], r"\[environment\] env must be a table of NAME"),
        (
            [('env = { LANG = "C.UTF-8" }', 'env = { "1BAD" = "x" }')],
            r"'1BAD' is not a valid environment variable name",
        ),
        ([(TOP, TOP + "\nagent = 5"), ("[agent]\ntimeout_sec = 120.0\n", "")], r"\[agent\] must be a table of keys"),
        ([(TOP, TOP + "\nmetadata = 3"), (METADATA, "")], r"\[metadata\] must be a table"),
        ([('name = "sandrl/hello-file"', "name = [1]")], r"\[task\] name must be a string"),
        (
            [("build_timeout_sec = 300.0", 'build_timeout_sec = 300.0\nworkdir = "app"')],
            r"workdir must be an absolute path",
        ),
        ([(TOP, "version = = ")], r"is not valid TOML"),
    ],
)
def test_wrong_types_and_syntax_name_the_file_key_and_fix(
    tmp_path: Path, edits: list[tuple[str, str]], expected: str
) -> None:
    task_dir = _broken(tmp_path, *edits)
    with pytest.raises(InvalidTaskError, match=expected) as info:
        load_harbor_task(task_dir)
    assert str(task_dir / "task.toml") in str(info.value)
    assert info.value.path == task_dir
    assert info.value.error_code == "invalid_task"


def test_deprecated_size_that_is_not_a_size(tmp_path: Path) -> None:
    task_dir = _broken(tmp_path, ("memory_mb = 1024", 'memory = "lots"'))
    with pytest.raises(InvalidTaskError, match=r'memory must be a size such as "4G".*memory_mb = 4096'):
        load_harbor_task(task_dir)


@pytest.mark.parametrize(
    ("missing", "expected"),
    [
        ("task.toml", r"task\.toml is missing"),
        ("instruction.md", r"instruction\.md is missing"),
        ("tests/test.sh", r"tests/test\.sh is missing; it is the verifier's entry point"),
        ("environment", r"has no environment; add environment/Dockerfile or set \[environment\] docker_image"),
    ],
)
def test_missing_files_are_reported_with_the_fix(tmp_path: Path, missing: str, expected: str) -> None:
    task_dir = _broken(tmp_path, remove=missing)
    with pytest.raises(InvalidTaskError, match=expected):
        load_harbor_task(task_dir)


def test_empty_instruction_is_an_error(tmp_path: Path) -> None:
    task_dir = _broken(tmp_path)
    (task_dir / "instruction.md").write_text("  \n")
    with pytest.raises(InvalidTaskError, match=r"instruction\.md: is empty"):
        load_harbor_task(task_dir)


@pytest.mark.parametrize("name", ["environment/Dockerfile", "instruction.md", "task.toml"])
def test_a_huge_task_file_is_refused_without_being_read_whole(tmp_path: Path, name: str) -> None:
    """A hostile task's 64 GiB (sparse) file: refused after one character past the bound, with the fix."""
    task_dir = _broken(tmp_path)
    huge = task_dir / name
    huge.write_text("x\n")  # its NULs are valid UTF-8: only its size may refuse it
    os.truncate(huge, 64 << 30)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    too_long = rf"{re.escape(str(huge))}: is more than {MAX_TASK_FILE_CHARS} characters long.*COPY"
    with pytest.raises(InvalidTaskError, match=too_long):
        load_harbor_task(task_dir)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 256 << 10  # KiB: nowhere near 64 GiB
