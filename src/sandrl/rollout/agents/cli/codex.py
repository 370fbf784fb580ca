"""OpenAI Codex (``--agent codex``): the Codex CLI's native binary, in ``codex exec`` (its non-interactive mode).

**Files.** npm ``@openai/codex`` is a node wrapper that execs a native binary from the platform
package ``@openai/codex@<version>-linux-x64`` (``-linux-arm64``); sandrl takes that package's
``vendor/<target>/`` (``bin/codex``, static musl: no C library of the image's is used, no node;
``codex-path/rg``; its package manifest; not its voice runtime) and lays it at
``/opt/sandrl/agents/codex-<version>/``.

**Run.** ``codex exec --json -`` reads the instruction on its standard input and prints its events
as JSON lines (kept with the episode). ``--dangerously-bypass-approvals-and-sandbox``: no approval
prompts, and its commands run directly: Codex's own Landlock/seccomp sandbox would nest inside the
episode's sandbox, which is the isolation. ``--skip-git-repo-check``: a task's directory need not
be a git repository.

Its model provider is the session (``$CODEX_HOME/config.toml``, ``CODEX_HOME`` in the agent's own
directory): ``base_url`` = the session's endpoint seen from inside the sandbox (it posts to
``/responses`` under it), ``wire_api = "responses"``, the key from ``env_key``, no retries (a
refused call is final: the gateway says why). Off: the update check, analytics, feedback, history,
web search, reasoning summaries (the policy's template decides what it thinks) and sub-agents (their
tool is a ``namespace`` of tools the gateway does not serve, and each would be a second conversation
interleaved in the episode's session).
"""

from __future__ import annotations

import json

from sandrl.errors import ImageBuildError
from sandrl.rollout.agents.cli.spec import WORK_DIR, CliSpec, Launch, LaunchInputs, Payload, Platform

NAME = "codex"
NPM_NAME = "@openai/codex"
TARGETS = {"x64": "x86_64-unknown-linux-musl", "arm64": "aarch64-unknown-linux-musl"}
CODEX_HOME = f"{WORK_DIR}/codex"
INSTRUCTION = f"{WORK_DIR}/instruction.md"
KEY_ENV = "SANDRL_SESSION_KEY"


def payload(version: str, platform: Platform) -> Payload:
    target = TARGETS.get(platform.arch)
    if target is None:
        raise ImageBuildError(f"Codex ships no Linux binary for {platform.arch} (only {', '.join(TARGETS)})")
    vendor = f"vendor/{target}"
    files = (
        (f"{vendor}/bin", "bin"),
        (f"{vendor}/codex-path", "codex-path"),
        (f"{vendor}/codex-resources/bwrap", "codex-resources/bwrap"),
        (f"{vendor}/codex-package.json", "codex-package.json"),
    )
    return Payload(NPM_NAME, f"{version}-linux-{platform.arch}", files, f"linux-{platform.arch}")


def config_toml(inputs: LaunchInputs) -> str:
    """Codex's ``config.toml`` for one episode (strings written as JSON's, which TOML reads alike)."""
    q = json.dumps
    return "\n".join(
        [
            f"model = {q(inputs.model)}",
            'model_provider = "sandrl"',
            "check_for_update_on_startup = false",
            'model_reasoning_summary = "none"',
            'web_search = "disabled"',
            "",
            "[analytics]",
            "enabled = false",
            "",
            "[feedback]",
            "enabled = false",
            "",
            "[history]",
            'persistence = "none"',
            "",
            "[agents]",
            "enabled = false",
            "",
            "[model_providers.sandrl]",
            'name = "sandrl"',
            f"base_url = {q(inputs.base_url)}",
            f"env_key = {q(KEY_ENV)}",
            'wire_api = "responses"',
            "request_max_retries = 0",
            "stream_max_retries = 0",
            "",
        ]
    )


def launch(inputs: LaunchInputs) -> Launch:
    argv = (
        f"{inputs.install_dir}/bin/codex",
        "exec",
        "--json",
        "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox",
        "-",
    )
    env = {"CODEX_HOME": CODEX_HOME, KEY_ENV: inputs.api_key}
    files = {f"{CODEX_HOME}/config.toml": config_toml(inputs).encode(), INSTRUCTION: inputs.instruction.encode()}
    return Launch(argv, env, files, stdin_file=INSTRUCTION)


SPEC = CliSpec(
    name=NAME,
    setting="codex",
    payload=payload,
    executable="bin/codex",
    launch=launch,
    needs="Linux on x86-64 or arm64 (the binary is static: no C library or node needed), /bin/sh, and bash "
    "for its shell tool",
)
