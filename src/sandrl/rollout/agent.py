"""The agent interface: what :func:`~sandrl.rollout.episode.run_episode` drives in a sandbox.

An agent works in a live sandbox until it is done or a :class:`Budget` runs out, and returns an
:class:`AgentResult`: its turns, the conversation's token ids (for a model-driven agent) and
how it stopped. It does not verify and does not close the sandbox; the episode does both.

Errors: an agent raises :class:`~sandrl.errors.SandboxError` or
:class:`~sandrl.errors.InferenceError` when the machinery under it fails (the episode records
an ``infra_error``), and returns normally for everything the policy did, even when the model's
output made no sense. Implementations: :class:`~sandrl.rollout.agents.llm.LLMAgent`, and in
:mod:`sandrl.rollout.agents.scripted` the oracle, null and replay agents.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from sandrl.errors import ConfigError
from sandrl.inference.base import InferenceClient
from sandrl.rollout.images import ImageFor
from sandrl.rollout.trajectory import StopReason, Turn
from sandrl.sandbox.base import Sandbox, SandboxProvider
from sandrl.tasks.task import Task


@dataclass(frozen=True)
class Budget:
    """Limits of one agent run; reaching one ends the episode as ``truncated`` at that turn."""

    max_turns: int = 20
    """Most model turns (or replayed steps)."""
    max_total_tokens: int = 8192
    """Most ids in the conversation (prompt, model output and observations together)."""
    wall_time_s: float | None = None
    """The agent's wall-time budget; None: the task's ``agent_timeout_s``."""

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ConfigError(f"max_turns must be >= 1, got {self.max_turns}")
        if self.max_total_tokens < 1:
            raise ConfigError(f"max_total_tokens must be >= 1, got {self.max_total_tokens}")
        if self.wall_time_s is not None and not (math.isfinite(self.wall_time_s) and self.wall_time_s > 0):
            raise ConfigError(f"wall_time_s must be a positive number of seconds, got {self.wall_time_s!r}")

    def wall_time_for(self, task: Task) -> float:
        return self.wall_time_s if self.wall_time_s is not None else task.agent_timeout_s


class Deadline:
    """A point in monotonic time; ``remaining()`` is never negative."""

    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds

    def remaining(self) -> float:
        return max(0.0, self.at - time.monotonic())

    @property
    def expired(self) -> bool:
        return time.monotonic() >= self.at


@dataclass
class AgentResult:
    """What an agent did. Token fields are empty for agents without a model."""

    stop_reason: StopReason
    turns: list[Turn] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    prompt_len: int = 0
    error: str | None = None
    """Set with ``stop_reason="error"``: why the agent could not go on (the policy's or agent's fault)."""
    error_code: str | None = None
    """With ``error``: its :class:`~sandrl.errors.SandrlError` code, e.g. ``sandbox_crashed`` when the
    commands the policy ran brought the sandbox down (the episode is then scored 0); None: ``agent_failed``."""

    segment_starts: list[int] = field(default_factory=lambda: [0])
    """Where each segment of ``ids`` starts (see :attr:`~sandrl.rollout.trajectory.Trajectory.segment_starts`)."""
    agent_logs: dict[str, str] = field(default_factory=dict)
    """What the agent printed, bounded (see :attr:`~sandrl.rollout.trajectory.Trajectory.agent_logs`)."""
    resume_from: object = None
    """What the :class:`ContinuingAgent` that made this result needs to go on with its conversation;
    opaque to everyone else, never recorded."""

    @property
    def truncated(self) -> bool:
        return self.stop_reason in ("max_turns", "max_tokens", "wall_time")


@runtime_checkable
class Agent(Protocol):
    """Works on a task in a sandbox, within a budget."""

    name: str
    """Recorded on every trajectory (llm, oracle, null, replay)."""

    async def run(self, task: Task, sandbox: Sandbox, policy: InferenceClient | None, budget: Budget) -> AgentResult:
        """Run until done or out of budget. Raise only for infrastructure failures."""
        ...


@runtime_checkable
class ContinuingAgent(Agent, Protocol):
    """An agent that can go on with a conversation it ran: a Harbor multi-step task's next step is then
    the next user turn of the same conversation (:mod:`sandrl.rollout.multi_step`); other agents get
    each step as a fresh run."""

    async def resume(
        self, task: Task, sandbox: Sandbox, policy: InferenceClient | None, budget: Budget, previous: AgentResult
    ) -> AgentResult:
        """Continue ``previous`` (a result of this agent) with ``task``'s instruction as the next user message,
        token-exact, within a fresh ``budget`` of turns and wall time (its token budget counts the whole
        conversation); return the whole conversation's result."""
        ...


@runtime_checkable
class InstallsInImage(Agent, Protocol):
    """An agent that runs inside the sandbox and brings its own files in the task's image (a CLI agent,
    :mod:`sandrl.rollout.agents.cli`): its runner starts each episode's sandbox from :meth:`image_for`'s image."""

    def image_for(self, task_image: ImageFor, provider: SandboxProvider) -> ImageFor:
        """The image of a task's sandboxes on ``provider``: ``task_image``'s with the agent's files over it."""
        ...
