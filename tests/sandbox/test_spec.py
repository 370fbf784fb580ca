from __future__ import annotations

import pytest

from sandrl.errors import InvalidSpecError
from sandrl.sandbox.base import SandboxSpec


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("cpus", 0, "cpus"),
        ("cpus", float("nan"), "cpus"),
        ("memory_mb", 1, "memory_mb"),
        ("memory_mb", 2.5, "whole number"),
        ("pids", True, "pids"),
        ("disk_mb", 0, "disk_mb"),
        ("ttl_s", -1, "ttl_s"),
        ("workdir", "relative/dir", "absolute"),
        ("image", "Bad Name", "image"),
        ("network", "yes", "network"),
    ],
)
def test_bad_spec_is_refused_with_a_message(field: str, value: object, words: str) -> None:
    with pytest.raises(InvalidSpecError, match=words):
        SandboxSpec(**{field: value})  # type: ignore[arg-type]


def test_bad_env_name_is_refused() -> None:
    with pytest.raises(InvalidSpecError, match="not a valid environment variable name"):
        SandboxSpec(env={"1BAD": "x"})


def test_spec_env_is_frozen_copy() -> None:
    env = {"A": "1"}
    spec = SandboxSpec(env=env)
    env["A"] = "2"
    assert spec.env["A"] == "1"
    with pytest.raises(TypeError):
        spec.env["B"] = "x"  # type: ignore[index]
