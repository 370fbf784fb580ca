"""One episode: create the sandbox, set up the environment, run the agent, verify, close.

::

    run_episode(task, provider, agent)
      sandbox_create  provider.create(task.to_sandbox_spec(image=...))
      setup           prepare_environment(task, sandbox); not in a forked group's episodes
                      (:mod:`sandrl.rollout.forks`: it ran once, in the group's parent)
      agent           agent.run(task, sandbox, policy, budget)
      verifier        verify(task, sandbox): tests/ written only now, then run, reward read
      close           sandbox.close(), always: on errors and on cancellation too

A Harbor multi-step task runs its steps between setup and close, each step's setup, agent and
verifier in turn (:mod:`sandrl.rollout.multi_step`); the phases' timings add up over the steps.

Nothing here raises for a failed episode: the failure is recorded on the returned
:class:`~sandrl.rollout.trajectory.Trajectory` (``status``, ``error``), and an ``infra_error``
has no reward. Only cancellation propagates, after the sandbox is closed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sandrl.aio import wait_out
from sandrl.errors import ConfigError
from sandrl.inference.base import InferenceClient
from sandrl.inference.fleet import affinity
from sandrl.rollout.agent import Agent, AgentResult, Budget
from sandrl.rollout.failures import classify, penalized
from sandrl.rollout.multi_step import run_steps
from sandrl.rollout.phases import PhaseClock
from sandrl.rollout.trajectory import EpisodeError, EpisodeStatus, Timings, Trajectory
from sandrl.sandbox.base import Sandbox, SandboxProvider
from sandrl.tasks.result import VerifyResult
from sandrl.tasks.task import Task
from sandrl.tasks.verify import prepare_environment, verify

log = logging.getLogger(__name__)

VERIFIER_TAIL_CHARS = 2000
"""How much of the end of the test output a trajectory keeps."""


@dataclass(frozen=True)
class EpisodeTimeouts:
    """How long each phase of an episode may take, beyond the agent's own :class:`Budget`; seconds.

    A phase that overruns ends the episode as an ``infra_error`` (the sandbox or its host stopped
    answering): the agent's and the verifier's own time limits come first, these are backstops.
    """

    create_timeout_s: float = 120.0
    """Creating the sandbox (the image is built before, outside the episode)."""
    setup_timeout_s: float = 600.0
    """Setting up the task's environment in the sandbox."""
    agent_grace_s: float = 30.0
    """The agent phase is abandoned this long after its wall-time budget."""
    verifier_grace_s: float = 120.0
    """Beyond the task's verifier timeout, for writing the tests and reading the reward."""
    close_timeout_s: float = 60.0
    """Closing the sandbox; past it the sandbox is left to its TTL."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"{f.name} must be a positive number of seconds, got {value!r}")


@dataclass(frozen=True)
class EpisodeConfig:
    """Budgets and per-phase timeouts of one episode."""

    budget: Budget = field(default_factory=Budget)
    timeouts: EpisodeTimeouts = field(default_factory=EpisodeTimeouts)


async def close_sandbox(sandbox: Sandbox, timeout_s: float) -> None:
    """Close ``sandbox`` and wait for it, even if the caller is cancelled meanwhile (then re-raise)."""
    closing = asyncio.ensure_future(sandbox.close())
    try:
        await wait_out([closing], timeout_s=timeout_s)
    finally:
        if not closing.done():
            log.warning("sandbox %s did not close within %g s; its TTL will reap it", sandbox.id, timeout_s)
        elif not closing.cancelled() and closing.exception() is not None:
            log.warning("closing sandbox %s failed: %s", sandbox.id, closing.exception())


def _verifier_record(result: VerifyResult) -> dict[str, Any]:
    record = {
        "exit_code": result.exit_code,
        "timed_out": result.timed_out,
        "error": result.error,
        "infra_error": result.infra_error,
        "duration_s": result.duration_s,
        "details": dict(result.details),
        "stdout_tail": result.stdout_tail[-VERIFIER_TAIL_CHARS:],
    }
    # Plain JSON types only, so the record round-trips through JSONL unchanged.
    loaded: dict[str, Any] = json.loads(json.dumps(record, default=str))
    return loaded


def _status(agent: AgentResult) -> EpisodeStatus:
    if agent.stop_reason == "error":
        return "agent_error"
    return "truncated" if agent.truncated else "completed"


def _oldest_version(agent: AgentResult) -> int | None:
    versions = [v for t in agent.turns for v in (t.start_weight_version, t.weight_version) if v is not None]
    return min(versions) if versions else None


async def run_episode(
    task: Task,
    provider: SandboxProvider,
    agent: Agent,
    *,
    policy: InferenceClient | None = None,
    config: EpisodeConfig | None = None,
    image: str = "host",
    episode_id: str | None = None,
    group_id: str | None = None,
    sample_index: int = 0,
    attempt: int = 1,
    queue_s: float = 0.0,
    forked_from: Mapping[str, Any] | None = None,
) -> Trajectory:
    """Run ``agent`` on ``task`` in a new sandbox of ``provider``; see the module docstring.

    ``image`` is the image the task's environment was built into (the provider's ``resolve_image`` of
    :meth:`~sandrl.tasks.task.Task.image_source`); ``host`` for a task without a Dockerfile.
    ``forked_from``: the episode is one of a group prepared once (:mod:`sandrl.rollout.forks`):
    ``image`` is the snapshot of the group's set-up sandbox, so the setup is not run again; the
    record (:meth:`~sandrl.rollout.forks.PreparedGroup.provenance`) goes on the trajectory.
    """
    cfg = config or EpisodeConfig()
    limits = cfg.timeouts
    group = group_id or f"adhoc/{task.id}"
    eid = episode_id or f"{group}/{sample_index}-{uuid.uuid4().hex[:8]}"
    clock = PhaseClock()
    route = affinity.current()  # the runner's key for the episode: its calls' waits for KV room add up on it
    kv_waited = route.kv_wait_s if route is not None else 0.0
    started_at = time.time()
    start = time.monotonic()
    sandbox: Sandbox | None = None
    agent_result: AgentResult | None = None
    verified: VerifyResult | None = None
    error: EpisodeError | None = None

    try:
        spec = task.to_sandbox_spec(image=image)
        sandbox = await clock.run("sandbox_create", "sandbox_create_s", limits.create_timeout_s, provider.create(spec))
        if forked_from is None:
            await clock.run("setup", "setup_s", limits.setup_timeout_s, prepare_environment(task, sandbox))
        if task.steps:
            agent_result, verified = await run_steps(task, sandbox, agent, policy, cfg.budget, limits, clock)
        else:
            wall = cfg.budget.wall_time_for(task) + limits.agent_grace_s
            agent_result = await clock.run("agent", "agent_s", wall, agent.run(task, sandbox, policy, cfg.budget))
            if agent_result.stop_reason != "error":
                timeout_s = task.verifier.timeout_s + limits.verifier_grace_s
                verified = await clock.run("verifier", "verifier_s", timeout_s, verify(task, sandbox))
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        phase = clock.phase
        error = classify(exc, phase)
        if phase == "agent" and isinstance(exc, TimeoutError):
            error = EpisodeError(
                "infra",
                phase,
                "agent_hung",
                f"the agent did not return within its wall time + {limits.agent_grace_s:g} s",
                retryable=True,
            )
        log.debug("episode %s failed in %s: %s", eid, phase, error.message)
    finally:
        if sandbox is not None:
            t0 = time.monotonic()
            try:
                await close_sandbox(sandbox, limits.close_timeout_s)
            finally:
                clock.add("close_s", time.monotonic() - t0)

    status: EpisodeStatus
    reward: float | None = None
    passed: bool | None = None
    verifier_record: dict[str, Any] = {}
    if verified is not None:
        verifier_record = _verifier_record(verified)
        if verified.infra_error:
            error = EpisodeError(
                "infra", "verifier", "verifier_broken", verified.error or "the verifier gave no reward", retryable=False
            )
    if error is None and agent_result is not None and agent_result.stop_reason == "error":
        code = agent_result.error_code or "agent_failed"
        error = EpisodeError("agent", "agent", code, agent_result.error or "the agent failed", False)
    if error is not None:
        status = "infra_error" if error.kind == "infra" else "agent_error"
        if penalized(error):
            reward, passed = 0.0, False
    else:
        assert agent_result is not None and verified is not None
        status = _status(agent_result)
        reward, passed = verified.reward, verified.passed

    turns = agent_result.turns if agent_result is not None else []
    timings = Timings(
        queue_s=queue_s,
        sandbox_create_s=clock.timings.get("sandbox_create_s", 0.0),
        setup_s=clock.timings.get("setup_s", 0.0),
        model_s=sum((t.model_s for t in turns), 0.0),
        kv_wait_s=route.kv_wait_s - kv_waited if route is not None else 0.0,
        command_s=sum((t.command_s for t in turns), 0.0),
        sandbox_wait_s=sum((t.sandbox_wait_s for t in turns), 0.0),
        agent_s=clock.timings.get("agent_s", 0.0),
        verifier_s=clock.timings.get("verifier_s", 0.0),
        close_s=clock.timings.get("close_s", 0.0),
        total_s=time.monotonic() - start,
    )
    return Trajectory(
        episode_id=eid,
        group_id=group,
        task_id=task.id,
        task_set=task.source.parent.name,
        sample_index=sample_index,
        agent=agent.name,
        status=status,
        stop_reason=agent_result.stop_reason if agent_result is not None else "error",
        reward=reward,
        passed=passed,
        attempt=attempt,
        ids=agent_result.ids if agent_result is not None else [],
        loss_mask=agent_result.loss_mask if agent_result is not None else [],
        logprobs=agent_result.logprobs if agent_result is not None else [],
        prompt_len=agent_result.prompt_len if agent_result is not None else 0,
        turns=list(turns),
        weight_version=_oldest_version(agent_result) if agent_result is not None else None,
        timings=timings,
        error=error,
        verifier=verifier_record,
        sandbox_id=sandbox.id if sandbox is not None else None,
        image=image,
        started_at=started_at,
        segment_starts=list(agent_result.segment_starts) if agent_result is not None else [0],
        forked_from=dict(forked_from) if forked_from is not None else None,
        agent_logs=dict(agent_result.agent_logs) if agent_result is not None else {},
    )
