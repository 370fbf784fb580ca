"""``[rollout.cli_agents]``: which version of each CLI agent a run installs, and from where."""

from __future__ import annotations

import math
from dataclasses import dataclass

from sandrl.errors import ConfigError
from sandrl.rollout.agents.cli.npm import NpmPackage

CLAUDE_CODE_VERSION = "2.1.332"
CODEX_VERSION = "0.171.0"


@dataclass(frozen=True)
class CliAgentsConfig:
    """The CLI agents (``agent = "claude-code"`` or ``"codex"``): their pinned versions, the npm registry
    they come from, and what is kept of their own logs. Each is fetched once into sandrl's cache and laid
    over the task's image as a layer of its own (see ``sandrl.rollout.agents.cli``)."""

    claude_code: str = CLAUDE_CODE_VERSION
    """Claude Code's version (npm ``@anthropic-ai/claude-code``; its native binary for this platform)."""
    codex: str = CODEX_VERSION
    """OpenAI Codex's version (npm ``@openai/codex``; its native binary for this platform)."""
    registry: str = ""
    """The npm registry (a mirror's URL); empty: ``$SANDRL_NPM_REGISTRY``, else ``https://registry.npmjs.org``."""
    log_bytes: int = 65536
    """Bytes kept of the end of the CLI's output and of its error output, with each episode."""
    stop_grace_s: float = 5.0
    """Once the gateway refused a call for the budget, how long the CLI has to end by itself before it
    is killed."""

    def __post_init__(self) -> None:
        for setting in ("claude_code", "codex"):
            NpmPackage("sandrl-check", getattr(self, setting) or "?", setting=f"[rollout.cli_agents] {setting}")
        if self.registry:
            NpmPackage("sandrl-check", "0", registry=self.registry)
        if (
            isinstance(self.log_bytes, bool)
            or not isinstance(self.log_bytes, int)
            or not 0 <= self.log_bytes <= 1 << 24
        ):
            raise ConfigError(f"log_bytes must be a whole number of bytes from 0 to 16 MiB, got {self.log_bytes!r}")
        if not (
            isinstance(self.stop_grace_s, int | float) and math.isfinite(self.stop_grace_s) and self.stop_grace_s >= 0
        ):
            raise ConfigError(f"stop_grace_s must be a number of seconds >= 0, got {self.stop_grace_s!r}")
