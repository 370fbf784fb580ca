"""Claude Code (``--agent claude-code``): Anthropic's CLI agent, its native binary, in print mode.

**Files.** npm ``@anthropic-ai/claude-code`` is a small wrapper whose install script copies a
native binary (Bun-built, no node needed) out of a per-platform package; sandrl takes that binary
straight from the platform package: ``@anthropic-ai/claude-code-linux-x64`` (glibc >= 2.26) or
``-linux-x64-musl`` (musl, e.g. Alpine; ``arm64`` alike), chosen by the C library the task's image
has. It is laid at ``/opt/sandrl/agents/claude-code-<version>/claude``.

**Run.** ``claude -p`` (print mode: one task, no terminal) reads the instruction on its standard
input, with ``--dangerously-skip-permissions`` (every tool runs without asking: the episode's
sandbox is the isolation; as root it needs ``IS_SANDBOX=1``) and ``--output-format stream-json
--verbose``, its events one JSON line each (kept with the episode). Its API is the session's:
``ANTHROPIC_BASE_URL`` = the session's endpoint seen from inside the sandbox (it posts to
``/v1/messages`` under it), ``ANTHROPIC_API_KEY`` = the session's key (sent as ``x-api-key``).

What is turned off, so that every model call it makes is the episode's and nothing leaves the
sandbox: telemetry, error reporting, the auto-updater and every other non-essential request
(``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC``), side calls to a "small fast model"
(``DISABLE_NON_ESSENTIAL_MODEL_CALLS``; the small and sub-agent models are the policy anyway),
thinking (the policy's template decides), retries (``CLAUDE_CODE_MAX_RETRIES=0``: a refused call
is final, the gateway says why) and the non-streaming fallback (it would send the same turn again).
``CLAUDE_CODE_MAX_OUTPUT_TOKENS`` is the run's ``max_new_tokens``; its Bash tool's timeout the
run's ``command_timeout_s``. Its configuration and transcripts go to ``CLAUDE_CONFIG_DIR``, in the
agent's own directory, so that the task's ``$HOME`` stays as the task made it.
"""

from __future__ import annotations

from sandrl.errors import ImageBuildError
from sandrl.rollout.agents.cli.spec import WORK_DIR, CliSpec, Launch, LaunchInputs, Payload, Platform

NAME = "claude-code"
NPM_PREFIX = "@anthropic-ai/claude-code"
INSTRUCTION = f"{WORK_DIR}/instruction.md"


def payload(version: str, platform: Platform) -> Payload:
    if platform.libc is None:
        raise ImageBuildError(
            "Claude Code's binary needs glibc (>= 2.26) or musl in the task's image, and the image has neither "
            "loader (/lib64/ld-linux-*.so.2, /lib/ld-musl-*.so.1): use another agent for this task, or an image "
            "with a C library"
        )
    variant = f"linux-{platform.arch}" + ("-musl" if platform.libc == "musl" else "")
    return Payload(f"{NPM_PREFIX}-{variant}", version, (("claude", "claude"),), variant)


def launch(inputs: LaunchInputs) -> Launch:
    command_ms = str(int(inputs.command_timeout_s * 1000))
    env = {
        "IS_SANDBOX": "1",
        "ANTHROPIC_BASE_URL": inputs.base_url,
        "ANTHROPIC_API_KEY": inputs.api_key,
        "ANTHROPIC_MODEL": inputs.model,
        "ANTHROPIC_SMALL_FAST_MODEL": inputs.model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": inputs.model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": inputs.model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": inputs.model,
        "CLAUDE_CODE_SUBAGENT_MODEL": inputs.model,
        "CLAUDE_CONFIG_DIR": f"{WORK_DIR}/claude",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_NON_ESSENTIAL_MODEL_CALLS": "1",
        "DISABLE_COST_WARNINGS": "1",
        "CLAUDE_CODE_MAX_RETRIES": "0",
        "CLAUDE_CODE_DISABLE_NONSTREAMING_FALLBACK": "1",
        "MAX_THINKING_TOKENS": "0",
        "CLAUDE_CODE_DISABLE_ADAPTIVE_THINKING": "1",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(inputs.max_new_tokens),
        "BASH_DEFAULT_TIMEOUT_MS": command_ms,
        "BASH_MAX_TIMEOUT_MS": command_ms,
    }
    argv = (
        f"{inputs.install_dir}/claude",
        "-p",
        "--model",
        inputs.model,
        "--dangerously-skip-permissions",
        "--output-format",
        "stream-json",
        "--verbose",
    )
    return Launch(argv, env, {INSTRUCTION: inputs.instruction.encode()}, stdin_file=INSTRUCTION)


SPEC = CliSpec(
    name=NAME,
    setting="claude_code",
    payload=payload,
    executable="claude",
    launch=launch,
    needs="Linux on x86-64 or arm64 with glibc >= 2.26 or musl, /bin/sh, and bash for its Bash tool",
)
