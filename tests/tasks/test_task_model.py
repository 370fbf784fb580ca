"""The Task model: its sandbox spec, env templates and what is read from a Dockerfile."""

from __future__ import annotations

import dataclasses
import posixpath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandrl.errors import InvalidSpecError, TaskError
from sandrl.sandbox.base import SandboxSpec
from sandrl.tasks import load_task
from sandrl.tasks.dockerfile import read_dockerfile
from sandrl.tasks.envvars import resolve_env

from .conftest import FIXTURES


def test_to_sandbox_spec_maps_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    task = load_task(FIXTURES / "harbor" / "hello-file")
    spec = task.to_sandbox_spec()
    assert isinstance(spec, SandboxSpec)
    assert (spec.image, spec.cpus, spec.memory_mb, spec.disk_mb, spec.network) == ("host", 2.0, 1024, 4096, False)
    assert spec.workdir == "/app"
    assert dict(spec.env) == {"LANG": "C.UTF-8"}
    assert spec.ttl_s >= task.environment.build_timeout_s + task.agent_timeout_s + task.verifier.timeout_s
    assert task.to_sandbox_spec(image="python-3.11").image == "python-3.11"

    templated = dataclasses.replace(
        task, environment=dataclasses.replace(task.environment, env={"TOKEN": "${SANDRL_TOKEN_FOR_TEST}"})
    )
    monkeypatch.setenv("SANDRL_TOKEN_FOR_TEST", "abc")
    assert dict(templated.to_sandbox_spec().env) == {"TOKEN": "abc"}
    monkeypatch.delenv("SANDRL_TOKEN_FOR_TEST")
    with pytest.raises(
        TaskError, match=r"task hello-file: environment env: TOKEN refers to \$\{SANDRL_TOKEN_FOR_TEST\}"
    ):
        templated.to_sandbox_spec()


def test_sandbox_spec_refuses_what_it_cannot_honour() -> None:
    task = load_task(FIXTURES / "harbor" / "hello-file")
    too_small = dataclasses.replace(task, environment=dataclasses.replace(task.environment, memory_mb=4))
    with pytest.raises(InvalidSpecError, match="memory_mb"):
        too_small.to_sandbox_spec()


def test_tasks_are_frozen() -> None:
    task = load_task(FIXTURES / "harbor" / "hello-file")
    with pytest.raises(dataclasses.FrozenInstanceError):
        task.id = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        task.metadata["difficulty"] = "hard"  # type: ignore[index]


def test_env_templates() -> None:
    host = {"A": "1", "EMPTY": ""}
    env = {"X": "${A}", "Y": "pre-${A}-${B:-two}", "Z": "${EMPTY:-unused}", "PLAIN": "$A ${", "Q": "${C:-}"}
    assert resolve_env(env, where="t", host_env=host) == {
        "X": "1",
        "Y": "pre-1-two",
        "Z": "",
        "PLAIN": "$A ${",
        "Q": "",
    }
    with pytest.raises(TaskError, match=r"t: K refers to \$\{MISSING\}"):
        resolve_env({"K": "${MISSING}"}, where="t", host_env=host)


def test_dockerfile_facts() -> None:
    facts = read_dockerfile(
        "# syntax=docker/dockerfile:1\n"
        "ARG V=3.11\n"
        "FROM --platform=linux/amd64 python:${V}-slim AS build\n"
        "WORKDIR /src\n"
        "FROM build AS test\n"
        "FROM debian:12 AS final\n"
        "WORKDIR /opt\n"
        "RUN echo hi \\\n"
        "    # a comment inside a continuation\n"
        "    && echo there\n"
        'WORKDIR "app/../work"\n'
    )
    assert facts.base_image == "debian:12"
    assert facts.workdir == "/opt/work"
    assert read_dockerfile("FROM build\n").base_image == "build"
    staged = read_dockerfile("FROM alpine:3 AS one\nFROM one AS two\nFROM two\nWORKDIR $HOME\n")
    assert (staged.base_image, staged.workdir) == ("alpine:3", None)
    assert read_dockerfile("").base_image is None


@given(st.lists(st.from_regex(r"(/|\.\./|)[a-z]{1,5}(/[a-z]{1,5}){0,2}", fullmatch=True), min_size=1, max_size=6))
def test_workdir_follows_dockers_rules(steps: list[str]) -> None:
    expected = "/"
    for step in steps:
        expected = posixpath.normpath(posixpath.join(expected, step))
    text = "FROM scratch\nWORKDIR /\n" + "".join(f"WORKDIR {step}\n" for step in steps)
    assert read_dockerfile(text).workdir == expected


@pytest.mark.parametrize(
    ("text", "workdir"),
    [
        # The loader read these apart from the builder: it joined "\" lines under "# escape=`",
        # took a heredoc's body for instructions, and ended an instruction at a blank continuation line.
        ("# escape=`\nFROM debian:12\nRUN echo \\\nWORKDIR /srv\n", "/srv"),
        ("FROM debian:12\nWORKDIR /a\nRUN <<EOF\nWORKDIR /b\nEOF\n", "/a"),
        ("FROM debian:12\nRUN echo \\\n\nWORKDIR /c\n", None),
    ],
)
def test_dockerfile_facts_read_as_the_builder_reads(text: str, workdir: str | None) -> None:
    assert read_dockerfile(text).workdir == workdir
