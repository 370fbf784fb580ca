"""Which failures are the machinery's (``infra_error``) and which the agent's, and which are worth a retry.

An episode that failed because a sandbox could not be created, its host went away, the
inference server was down or the task itself is broken says nothing about the policy: it is an
``infra_error``, retried while the cause may pass, and never trained on as reward 0. A failure
of the agent's own code or configuration is an ``agent_error``.

A sandbox that crashed because of its own processes (:class:`~sandrl.errors.SandboxCrashedError`
with ``caused_by_sandbox``) while the agent worked in it, or while the verifier tested what the
agent left, is the policy's doing: an ``agent_error`` that is not retried and is trained as a
failure, reward 0 (:func:`penalized`). Were it infra, a policy could turn any failing episode into
an untrained one by exhausting its sandbox's memory.
"""

from __future__ import annotations

from sandrl.errors import (
    ConfigError,
    ImageBuildError,
    ImageNotFoundError,
    InferenceError,
    LimitUnsupportedError,
    SandboxCrashedError,
    SandboxError,
    SandboxRequestTooLargeError,
    SandboxUnavailableError,
    SandrlError,
    TaskError,
)
from sandrl.rollout.trajectory import EpisodeError

_PERMANENT_SANDBOX = (LimitUnsupportedError, SandboxUnavailableError, ImageNotFoundError, SandboxRequestTooLargeError)
"""Sandbox errors that the same host will raise again."""
POLICY_PHASES = ("agent", "verifier")
"""Phases in which what runs in the sandbox is the agent's, or judges what the agent left."""


def classify(exc: BaseException, phase: str) -> EpisodeError:
    """The :class:`EpisodeError` an exception raised in ``phase`` stands for."""
    code = exc.error_code if isinstance(exc, SandrlError) else type(exc).__name__
    message = str(exc) or type(exc).__name__
    if isinstance(exc, SandboxCrashedError) and exc.caused_by_sandbox and phase in POLICY_PHASES:
        return EpisodeError("agent", phase, code, message, retryable=False)
    if isinstance(exc, SandboxRequestTooLargeError) and phase == "agent":
        return EpisodeError("agent", phase, code, message, retryable=False)  # the agent's own request
    if isinstance(exc, SandboxError):
        return EpisodeError("infra", phase, code, message, retryable=not isinstance(exc, _PERMANENT_SANDBOX))
    if isinstance(exc, InferenceError):
        return EpisodeError("infra", phase, code, message, retryable=True)
    if isinstance(exc, ImageBuildError | TaskError):
        # A task that cannot be built or run is broken; another attempt would fail the same way.
        return EpisodeError("infra", phase, code, message, retryable=False)
    if isinstance(exc, TimeoutError):
        return EpisodeError("infra", phase, "phase_timeout", message, retryable=True)
    if isinstance(exc, OSError):
        # A lost connection to a sandbox host or a server.
        return EpisodeError("infra", phase, code, message, retryable=True)
    if isinstance(exc, ConfigError):
        return EpisodeError("agent", phase, code, message, retryable=False)
    if phase == "agent":
        return EpisodeError("agent", phase, code, message, retryable=False)
    # An unexpected error outside the agent is a bug in the machinery, not the policy's doing.
    return EpisodeError("infra", phase, code, message, retryable=False)


def penalized(error: EpisodeError) -> bool:
    """The policy brought its own sandbox down: the episode counts as a failure (reward 0), not dropped."""
    return error.kind == "agent" and error.error_code == SandboxCrashedError.error_code
