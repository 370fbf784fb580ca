"""External agent harnesses as sandrl agents: their LLM calls through a gateway session, their
commands in the episode's sandbox, their trajectory the session's.

A *harness* is any Python function ``harness(ctx: HarnessContext) -> str | None`` (or a coroutine
function): it points its OpenAI-compatible client at ``ctx.base_url`` (model name ``ctx.model``)
and runs its commands with ``ctx.exec`` (async) or ``ctx.exec_sync`` (from the worker thread a
plain function runs in). It returns how it ended (``submitted``, ``done``...; None: ``done``).
``--agent module:function`` names one; ``--agent mini-swe-agent`` is
:mod:`sandrl.rollout.agents.mini_swe_agent`.

The :class:`HarnessAgent` opens a gateway session in-process with the episode's budget
(``max_turns`` and ``max_total_tokens`` are enforced by the gateway: the call over budget is
refused and the episode ends ``truncated``), hands the harness the session's ``base_url`` and key
(``api_key``: no other session answers to it, and the gateway has no route to open one), runs the
harness within the agent's wall time, and returns the session's ids, loss mask, log-probs,
segments and turns (each turn's commands are the ones run after its completion). What the policy
did wrong, however the harness reports it, is the episode's outcome; a failure of sandrl's own
machinery under the harness (the inference server, the sandbox) is raised as the infra error it
is, even when the harness caught it.

A harness starts its own conversation from an instruction, so a Harbor multi-step task gives it each
step as a run of its own, in a session of its own: the trajectory holds one segment per step
(:mod:`sandrl.rollout.multi_step`). Only the built-in LLM agent continues one conversation across steps.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import inspect
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, Protocol, TypeVar, cast

from sandrl.errors import ConfigError, InferenceError, SandboxCrashedError, SandboxError
from sandrl.inference.base import InferenceClient
from sandrl.rollout.agent import AgentResult, Budget, Deadline
from sandrl.rollout.trajectory import STOP_REASONS, StopReason, Turn
from sandrl.sandbox.base import ExecResult, Sandbox
from sandrl.sandbox.command import Command, describe
from sandrl.tasks.task import Task

if TYPE_CHECKING:  # the gateway pulls in the HTTP stack; an agent that is not a harness never needs it
    from sandrl.inference.gateway import Gateway, Session

MINI_SWE_AGENT = "mini-swe-agent"
TERMINUS_2 = "terminus-2"
HARNESSES = {
    MINI_SWE_AGENT: "sandrl.rollout.agents.mini_swe_agent:run",
    TERMINUS_2: "sandrl.rollout.agents.terminus:run",
}
"""The harnesses sandrl ships, by the name ``--agent`` takes."""

_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=512, thread_name_prefix="harness")
"""Threads of plain-function harnesses: sized for hundreds of episodes at once, made on demand
(asyncio's default executor has a few workers and would queue episodes behind each other)."""


@dataclass
class CommandRecord:
    turn: int
    """The completion it followed (-1: before the first)."""
    command: str
    """As run: a shell line as given, an argv quoted as a shell line (:func:`sandrl.sandbox.command.describe`)."""
    exit_code: int
    duration_s: float
    wait_s: float
    timed_out: bool


P = ParamSpec("P")
R = TypeVar("R")


class _OnLoop(Protocol):
    loop: asyncio.AbstractEventLoop


C = TypeVar("C", bound=_OnLoop)


def _from_worker_thread(
    method: Callable[Concatenate[C, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[C, P], R]:
    """The blocking form of an async method, for a harness's worker thread: the call runs on the
    object's ``loop`` and the thread waits for its result."""

    def blocking(self: C, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return asyncio.run_coroutine_threadsafe(method(self, *args, **kwargs), self.loop).result()

    return blocking


@dataclass
class HarnessContext:
    """What a harness gets for one episode."""

    base_url: str
    """The session's OpenAI endpoint (``{base_url}/chat/completions``)."""
    model: str
    api_key: str
    """The session's key, the OpenAI client's ``api_key``: the gateway answers this session's routes only to it."""
    task: Task
    sandbox: Sandbox
    budget: Budget
    deadline: Deadline
    command_timeout_s: float
    loop: asyncio.AbstractEventLoop
    """The episode's event loop, where :meth:`exec_sync` runs the commands of the harness's thread."""
    session: Session
    temperature: float = 1.0
    max_new_tokens: int = 512
    commands: list[CommandRecord] = field(default_factory=list)
    logs: dict[str, str] = field(default_factory=dict)
    """What the harness keeps of the agent's own output (bounded): the episode's ``agent_logs``."""

    async def exec(
        self,
        command: Command,
        timeout_s: float | None = None,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        """Run ``command`` (in the task's working directory unless ``cwd``), within the per-command and the
        agent's time: a shell line, or an argv run with no shell (:mod:`sandrl.sandbox.command`)."""
        timeout = min(timeout_s or self.command_timeout_s, self.command_timeout_s, max(self.deadline.remaining(), 0.1))
        started = time.monotonic()
        result = await self.sandbox.exec(
            command, timeout_s=timeout, cwd=cwd or self.task.environment.workdir, env=dict(env) if env else None
        )
        self.commands.append(
            CommandRecord(
                len(self.session.turns) - 1,
                describe(command),
                result.exit_code,
                result.duration_s,
                time.monotonic() - started,
                result.timed_out,
            )
        )
        return result

    exec_sync = _from_worker_thread(exec)
    """:meth:`exec` from a harness's worker thread (same arguments): it runs on the episode's loop."""


Harness = Callable[[HarnessContext], Any]


def load_harness(spec: str) -> Harness:
    """The harness named ``spec``: one of :data:`HARNESSES` or ``module:function``."""
    spec = HARNESSES.get(spec, spec)
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"a harness agent is 'mini-swe-agent' or 'module:function', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import the harness module {module_name!r}: {exc}") from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"{module_name} has no function {attr!r} to run as a harness")
    return cast(Harness, fn)


class HarnessAgent:
    """Runs a harness for one episode through a gateway session; see the module docstring."""

    def __init__(
        self,
        harness: Harness,
        gateway: Gateway,
        base_url: str,
        *,
        name: str,
        command_timeout_s: float = 60.0,
        temperature: float = 1.0,
        max_new_tokens: int = 512,
    ) -> None:
        self.harness = harness
        self.gateway = gateway
        self.base_url = base_url.rstrip("/")
        self.name = name
        self.command_timeout_s = command_timeout_s
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens

    async def run(self, task: Task, sandbox: Sandbox, policy: InferenceClient | None, budget: Budget) -> AgentResult:
        deadline = Deadline(budget.wall_time_for(task))
        session = self.gateway.open(max_turns=budget.max_turns, max_total_tokens=budget.max_total_tokens)
        ctx = HarnessContext(
            base_url=f"{self.base_url}/v1/sessions/{session.id}",
            model=self.gateway.model_name,
            api_key=session.key,
            task=task,
            sandbox=sandbox,
            budget=budget,
            deadline=deadline,
            command_timeout_s=self.command_timeout_s,
            loop=asyncio.get_running_loop(),
            session=session,
            temperature=self.temperature,
            max_new_tokens=self.max_new_tokens,
        )
        stop: StopReason = "done"
        error: str | None = None
        error_code: str | None = None
        try:
            async with asyncio.timeout(deadline.remaining()):
                if inspect.iscoroutinefunction(self.harness):
                    outcome = await self.harness(ctx)
                else:
                    outcome = await asyncio.get_running_loop().run_in_executor(_POOL, self.harness, ctx)
            stop = _stop_reason(outcome)
        except TimeoutError:
            stop = "wall_time"
        except SandboxCrashedError as exc:
            if not exc.caused_by_sandbox:
                raise
            stop, error, error_code = "error", exc.message, exc.error_code
        except (SandboxError, InferenceError):
            raise
        except Exception as exc:
            if session.failure is None and session.stopped is None:
                stop, error, error_code = "error", f"the harness {self.name} failed: {exc!r}", "agent_failed"
        finally:
            self.gateway.close(session.id)  # a harness thread still running gets 404s from now on
        if session.failure is not None:
            raise session.failure  # the inference server failed under the harness: infra, whatever it reported
        if session.stopped is not None and stop != "error":
            stop = cast(StopReason, session.stopped)
        result = AgentResult(
            stop,
            _turns(session, ctx.commands),
            list(session.ids),
            list(session.loss_mask),
            list(session.logprobs),
            session.prompt_len,
            error,
            error_code,
        )
        result.segment_starts = list(session.segment_starts) or [0]
        result.agent_logs = dict(ctx.logs)
        return result


def _stop_reason(outcome: Any) -> StopReason:
    if outcome is None:
        return "done"
    if isinstance(outcome, str) and outcome in STOP_REASONS:
        return outcome
    raise ConfigError(f"a harness returns a stop reason ({', '.join(STOP_REASONS)}) or None, got {outcome!r}")


def _turns(session: Session, commands: list[CommandRecord]) -> list[Turn]:
    turns: list[Turn] = []
    for i, t in enumerate(session.turns):
        ran = [c for c in commands if c.turn == i]
        after = session.turns[i + 1] if i + 1 < len(session.turns) else None
        # What the next call appended to this segment; a next call that started a segment appended nothing here.
        observation_end = after.output_start if after is not None and not after.new_segment else t.output_end
        turns.append(
            Turn(
                index=i,
                command="\n".join(c.command for c in ran) or None,
                output_start=t.output_start,
                output_end=t.output_end,
                context_tokens=t.context_tokens,
                finish_reason=t.finish_reason,
                weight_version=t.weight_version,
                start_weight_version=t.start_weight_version,
                output_weight_versions=t.output_weight_versions,
                exit_code=ran[-1].exit_code if ran else None,
                timed_out=any(c.timed_out for c in ran),
                model_s=t.model_s,
                command_s=sum(c.duration_s for c in ran),
                sandbox_wait_s=sum(c.wait_s for c in ran),
                observation_start=t.output_end,
                observation_end=observation_end,
                tool_calls=list(t.reply.get("tool_calls") or []) or None,
            )
        )
    return turns
