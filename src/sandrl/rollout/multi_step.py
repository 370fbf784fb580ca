"""A Harbor multi-step task's episode: each step's setup, agent and verifier before the next step's, as
Harbor's ``MultiStepTrial`` runs them, in one sandbox and one trajectory.

::

    for step k of task.steps (the agent sees sandrl.tasks.multi_step.step_task(task, k)):
        setup      k > 0: prepare_step: /tests and /logs/verifier emptied, workdir/ copied, setup.sh (step 1's
                   ran in the episode's setup, prepare_environment); check_step: the step's healthcheck
        agent      k = 0, or an agent that cannot continue: agent.run, a fresh run (its ids a new segment)
                   k > 0 and a ContinuingAgent (the LLM agent): agent.resume, the step's instruction the next
                   user turn of the same conversation, token-exact
        artifacts  collect_artifacts: the step's, recorded in its record
        verifier   verify(the step): its record; Harbor's min_reward early stop
    roll_up: the steps' rewards, mean (Harbor's default) or final

Budgets: ``max_turns`` and the wall time are per step (the step's ``[steps.agent] timeout_sec``
unless the budget sets one), ``max_total_tokens`` counts the whole conversation (a conversation that
is full goes on to the next steps with no turn: their verifiers judge what is there, as Harbor's
do after an agent that ran out of context). An agent that fails (``error``) ends the episode as
today. A harness agent (``--agent mini-swe-agent``, ``terminus-2``, ``module:function``) runs each step
as a fresh run in a gateway session of its own (whose token budget is its own): the harnesses start
their own conversations, so the trajectory holds one segment per step
(:attr:`~sandrl.rollout.trajectory.Trajectory.segment_starts`), each trained with the episode's reward.

The trajectory records per step, in ``verifier["details"]["steps"]``: its rewards, the verifier's exit
code and error, ``agent`` (its stop reason and ``turns``, the ``[start, end)`` of its turns in the
trajectory's), ``artifacts`` and ``stopped`` (no further step ran).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Protocol

from sandrl.errors import TaskError
from sandrl.inference.base import InferenceClient
from sandrl.rollout.agent import Agent, AgentResult, Budget, ContinuingAgent
from sandrl.rollout.phases import PhaseClock
from sandrl.sandbox.base import Sandbox
from sandrl.tasks.multi_step import below_min_reward, collect_artifacts, roll_up, step_record, step_task
from sandrl.tasks.result import VerifyResult
from sandrl.tasks.step_setup import STEP_SETUP_FAILED, check_step, prepare_step
from sandrl.tasks.task import Task
from sandrl.tasks.verify import verify


class PhaseLimits(Protocol):
    """The backstops a step's phases run within (:class:`~sandrl.rollout.episode.EpisodeTimeouts`)."""

    @property
    def setup_timeout_s(self) -> float: ...
    @property
    def agent_grace_s(self) -> float: ...
    @property
    def verifier_grace_s(self) -> float: ...


def after(earlier: AgentResult | None, fresh: AgentResult) -> AgentResult:
    """``fresh``, a run of its own, after ``earlier``: its ids a new segment, its turns numbered on."""
    if earlier is None:
        return fresh
    offset = len(earlier.ids) if fresh.ids else 0
    turns = list(earlier.turns)
    for turn in fresh.turns:
        turns.append(
            dataclasses.replace(
                turn,
                index=len(turns),
                output_start=turn.output_start + offset,
                output_end=turn.output_end + offset,
                observation_start=turn.observation_start + offset,
                observation_end=turn.observation_end + offset,
            )
        )
    merged = AgentResult(
        fresh.stop_reason,
        turns,
        earlier.ids + fresh.ids,
        earlier.loss_mask + fresh.loss_mask,
        earlier.logprobs + fresh.logprobs,
        earlier.prompt_len if earlier.ids else fresh.prompt_len,
        fresh.error,
        fresh.error_code,
    )
    starts = earlier.segment_starts if earlier.ids else []
    merged.segment_starts = (
        [*starts, *(s + offset for s in fresh.segment_starts)] if fresh.ids else earlier.segment_starts
    )
    merged.agent_logs = dict(fresh.agent_logs or earlier.agent_logs)  # bounded: the latest step's
    return merged


def _failed_setup(name: str, error: TaskError, records: list[dict[str, object]]) -> dict[str, object]:
    """A later step whose setup or healthcheck failed: 0 on every reward key the steps so far had."""
    keys: set[str] = set()
    for record in records:
        found = record.get("rewards")
        if isinstance(found, Mapping):
            keys.update(str(k) for k in found)
    rewards = dict.fromkeys(sorted(keys or {"reward"}), 0.0)
    return {"step": name, "reward": 0.0, "rewards": rewards, "exit_code": None, "error": str(error)}


async def _set_up(task: Task, index: int, sandbox: Sandbox) -> None:
    if index > 0:
        await prepare_step(task, index, sandbox)
    await check_step(task, index, sandbox)


async def run_steps(
    task: Task,
    sandbox: Sandbox,
    agent: Agent,
    policy: InferenceClient | None,
    budget: Budget,
    limits: PhaseLimits,
    clock: PhaseClock,
) -> tuple[AgentResult | None, VerifyResult | None]:
    """Every step of ``task`` in ``sandbox``; see the module docstring. Returns the whole conversation's agent
    result and the rolled-up verifier result (None when no step was verified). Raises what the episode
    classifies: a failure of the machinery, a step-1 setup that failed, a phase past its timeout."""
    result: AgentResult | None = None
    records: list[dict[str, object]] = []
    last: VerifyResult | None = None
    verify_s = 0.0
    for index, step in enumerate(task.steps):
        view = step_task(task, index)
        more = index < len(task.steps) - 1
        try:
            if index > 0 or step.healthcheck is not None:
                await clock.run("setup", "setup_s", limits.setup_timeout_s, _set_up(task, index, sandbox))
        except TaskError as exc:
            if index == 0 or exc.error_code != STEP_SETUP_FAILED:
                raise  # before the agent did anything: the task's failure
            records.append(_failed_setup(step.name, exc, records) | ({"stopped": True} if more else {}))
            break
        first = len(result.turns) if result is not None else 0
        wall = budget.wall_time_for(view) + limits.agent_grace_s
        if result is not None and isinstance(agent, ContinuingAgent):
            resumed = agent.resume(view, sandbox, policy, budget, result)
            result = await clock.run("agent", "agent_s", wall, resumed)
        else:
            fresh = await clock.run("agent", "agent_s", wall, agent.run(view, sandbox, policy, budget))
            result = after(result, fresh)
        ran = {"stop_reason": result.stop_reason, "turns": [first, len(result.turns)]}
        if result.stop_reason == "error":
            break  # the episode is the agent's failure, as a single-step one is
        grace = limits.verifier_grace_s
        artifacts = await clock.run("verifier", "verifier_s", grace, collect_artifacts(task, index, sandbox))
        verified = await clock.run("verifier", "verifier_s", step.verifier.timeout_s + grace, verify(view, sandbox))
        verify_s += verified.duration_s
        record = step_record(step.name, verified) | {"agent": ran, "artifacts": artifacts}
        if verified.infra_error:
            details = {"steps": [*records, record]}
            broken = f"step {step.name}: {verified.error}"
            return result, dataclasses.replace(verified, details=details, error=broken)
        records.append(record)
        last = verified
        if below_min_reward(task, index, record):
            if more:
                record["stopped"] = True  # Harbor runs no further step
            break
    return result, roll_up(task, records, last, duration_s=verify_s)
