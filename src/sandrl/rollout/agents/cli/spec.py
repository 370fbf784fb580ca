"""What sandrl knows of one CLI agent: where its files come from, where they go, and how it is started.

One module per CLI (:mod:`.claude_code`, :mod:`.codex`) makes a :class:`CliSpec`; the installer
(:mod:`.install`) and the harness (:mod:`.harness`) read nothing else about it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

INSTALL_ROOT = "/opt/sandrl/agents"
"""Where CLI agents are laid in a sandbox's image: ``<root>/<agent>-<version>/`` each, so a task's own
files (its ``/usr/local/bin``) are never shadowed."""
WORK_DIR = "/opt/sandrl/episode"
"""The agent's own files in the sandbox: its instruction, config and logs (not under ``/tmp``, where
Codex refuses to make its helper programs; ``/opt/sandrl`` is in every image a CLI agent runs in)."""
STDOUT_LOG = f"{WORK_DIR}/stdout.log"
STDERR_LOG = f"{WORK_DIR}/stderr.log"

Libc = Literal["glibc", "musl"]


@dataclass(frozen=True)
class Platform:
    """What a task image runs: its CPU (npm's names, ``x64``, ``arm64``) and its C library (None: none found)."""

    arch: str
    libc: Libc | None


@dataclass(frozen=True)
class Payload:
    """The files of one CLI for one platform: an npm package version, and where each path of it goes
    under the install directory (a directory path takes its whole subtree)."""

    npm_name: str
    npm_version: str
    files: tuple[tuple[str, str], ...]
    """(path in the package, path under ``<INSTALL_ROOT>/<agent>-<version>/``)."""
    variant: str
    """Names this payload among the CLI's (``linux-x64``, ``linux-x64-musl``): part of the layer's key."""


@dataclass(frozen=True)
class Launch:
    """How one episode starts the CLI: files written first, then ``argv`` run in the task's
    working directory with ``env``, its standard input read from ``stdin_file``."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    files: Mapping[str, bytes] = field(default_factory=dict)
    """Path in the sandbox -> content (the instruction, the CLI's config)."""
    stdin_file: str = "/dev/null"


@dataclass(frozen=True)
class LaunchInputs:
    """What the episode gives a CLI: its instruction, the session's endpoint as seen from inside the
    sandbox, and the session's key and model name."""

    instruction: str
    base_url: str
    """``http://127.0.0.1:<forwarded port>/v1/sessions/<id>``: the session's own routes."""
    api_key: str
    model: str
    max_new_tokens: int
    temperature: float
    max_turns: int
    command_timeout_s: float
    install_dir: str


@dataclass(frozen=True)
class CliSpec:
    """One CLI agent, as its module describes it."""

    name: str
    """The name ``--agent`` takes (``claude-code``)."""
    setting: str
    """Its version's key in ``[rollout.cli_agents]`` (``claude_code``)."""
    payload: Callable[[str, Platform], Payload]
    """Its files for a version and a platform; raises :class:`~sandrl.errors.ImageBuildError` for a
    platform it does not ship for."""
    executable: str
    """Its program, relative to the install directory."""
    launch: Callable[[LaunchInputs], Launch]
    needs: str
    """What it needs of a task's image, said in the README and in errors."""

    def install_dir(self, version: str) -> str:
        return f"{INSTALL_ROOT}/{self.name}-{version}"
