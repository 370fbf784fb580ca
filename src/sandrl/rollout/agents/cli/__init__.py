"""CLI agents (``--agent claude-code``, ``--agent codex``): coding agents as they ship, inside the episode's sandbox.

A CLI agent is a harness (:class:`~sandrl.rollout.agents.harness.HarnessAgent`: a gateway session per
episode, its budget, its token-exact trajectory) whose agent is a program living in the task's
machine and speaking its vendor's API to the session:

- its files: :mod:`.install` (fetched from npm at the version ``[rollout.cli_agents]`` pins, laid
  over each task image as a cached layer, checked to run there);
- its episode: :mod:`.harness` (the gateway forwarded into the sandbox, the CLI started in its
  non-interactive mode, ended on the budget, its logs kept);
- each CLI's own settings: :mod:`.claude_code`, :mod:`.codex`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandrl.errors import ConfigError
from sandrl.rollout.agents.cli import claude_code, codex
from sandrl.rollout.agents.cli.config import CliAgentsConfig
from sandrl.rollout.agents.cli.harness import CliHarness
from sandrl.rollout.agents.cli.install import AgentImages, CliInstall
from sandrl.rollout.agents.cli.npm import registry_url
from sandrl.rollout.agents.cli.spec import CliSpec
from sandrl.rollout.agents.harness import HarnessAgent
from sandrl.rollout.images import ImageFor
from sandrl.sandbox.base import SandboxProvider

if TYPE_CHECKING:
    from sandrl.inference.gateway import Gateway

__all__ = ["CLI_AGENTS", "CliAgent", "CliAgentsConfig", "cli_install"]

CLI_AGENTS: dict[str, CliSpec] = {claude_code.NAME: claude_code.SPEC, codex.NAME: codex.SPEC}
"""The CLI agents sandrl runs, by the name ``--agent`` takes."""


def cli_install(name: str, config: CliAgentsConfig) -> CliInstall:
    """The install of the CLI agent ``name`` at the version ``config`` pins."""
    spec = CLI_AGENTS.get(name)
    if spec is None:
        raise ConfigError(f"no CLI agent {name!r}: the CLI agents are {', '.join(CLI_AGENTS)}")
    return CliInstall(spec, getattr(config, spec.setting), registry=registry_url(config.registry))


class CliAgent(HarnessAgent):
    """A :class:`HarnessAgent` running a CLI in the sandbox; its runner starts sandboxes from the task's
    image with the CLI laid over it (:meth:`image_for`)."""

    def __init__(
        self,
        install: CliInstall,
        config: CliAgentsConfig,
        gateway: Gateway,
        base_url: str,
        *,
        command_timeout_s: float = 60.0,
        temperature: float = 1.0,
        max_new_tokens: int = 512,
    ) -> None:
        super().__init__(
            CliHarness(install, config).run,
            gateway,
            base_url,
            name=install.spec.name,
            command_timeout_s=command_timeout_s,
            temperature=temperature,
            max_new_tokens=max_new_tokens,
        )
        self.install = install

    def image_for(self, task_image: ImageFor, provider: SandboxProvider) -> ImageFor:
        """``task_image`` with this agent's CLI over each image it names, on ``provider``."""
        return AgentImages(self.install, task_image, provider)
