"""Issue #18 (9b): a sandbox its own processes brought down fails the episode (reward 0, trained,
not retried); one they did not bring down stays an infra error (retried, never trained)."""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from sandrl.errors import (
    SandboxClosedError,
    SandboxCrashedError,
    SandboxFileTooLargeError,
    SandboxRequestTooLargeError,
)
from sandrl.inference.tokenizer import ByteTokenizer
from sandrl.rollout import LLMAgent, RolloutRunner, RunnerConfig, run_episode
from sandrl.rollout.failures import classify, penalized
from sandrl.rollout.images import TaskImages
from sandrl.sandbox.base import ExecResult, SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider, BwrapSandbox
from sandrl.tasks import Task
from sandrl.train.adapter import batch_from_groups

from ..support import agent_host_pid
from .conftest import ScriptedPolicy, bash

# -- classify


@pytest.mark.parametrize("phase", ["agent", "verifier"])
def test_a_crash_the_sandbox_caused_is_the_agents_failure(phase: str) -> None:
    error = classify(SandboxCrashedError("sandbox sb-1 crashed: OOM", caused_by_sandbox=True), phase)
    assert (error.kind, error.phase, error.error_code, error.retryable) == ("agent", phase, "sandbox_crashed", False)
    assert penalized(error)
    assert "OOM" in error.message


@pytest.mark.parametrize("phase", ["sandbox_create", "setup"])
def test_a_crash_before_the_agent_ran_is_infra(phase: str) -> None:
    error = classify(SandboxCrashedError("crashed", caused_by_sandbox=True), phase)
    assert (error.kind, error.retryable) == ("infra", True)
    assert not penalized(error)


@pytest.mark.parametrize("phase", ["setup", "agent", "verifier"])
def test_a_crash_the_sandbox_did_not_cause_is_infra_and_retried(phase: str) -> None:
    for exc in (SandboxCrashedError("killed from the host", caused_by_sandbox=False), SandboxClosedError("gone")):
        error = classify(exc, phase)
        assert (error.kind, error.error_code, error.retryable) == ("infra", "sandbox_closed", True)
        assert not penalized(error)


def test_oversized_requests_and_reads_are_not_retried_as_host_failures() -> None:
    request = SandboxRequestTooLargeError("too large")
    assert (classify(request, "agent").kind, classify(request, "agent").retryable) == ("agent", False)
    assert (classify(request, "setup").kind, classify(request, "setup").retryable) == ("infra", False)
    assert not penalized(classify(request, "agent"))  # the harness's request, not the policy's doing
    assert classify(SandboxFileTooLargeError("big"), "setup").kind == "infra"


# -- episodes in real sandboxes


KillWhen = Callable[[BwrapSandbox, str], bool]


@dataclass
class KillPid1Provider:
    """Real sandboxes of 48 MiB whose pid 1 is SIGKILLed from the host before a command when ``kill_when``
    says so: what the OOM killer does when it picks pid 1 (it may, or may not, by itself)."""

    inner: BwrapProvider
    kill_when: KillWhen
    created: list[BwrapSandbox] = field(default_factory=list)

    async def create(self, spec: SandboxSpec) -> KilledSandbox:
        sandbox = await self.inner.create(dataclasses.replace(spec, memory_mb=48))
        self.created.append(sandbox)
        return KilledSandbox(sandbox, self.kill_when)


class KilledSandbox:
    def __init__(self, inner: BwrapSandbox, kill_when: KillWhen) -> None:
        self.inner, self.kill_when = inner, kill_when
        self.id = inner.id

    async def exec(self, command: str, **kwargs: object) -> ExecResult:
        if not self.inner.closed and self.kill_when(self.inner, command):
            os.kill(agent_host_pid(self.inner), signal.SIGKILL)
        return await self.inner.exec(command, **kwargs)  # type: ignore[arg-type]

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        await self.inner.write_file(path, data, mode)

    async def read_file(self, path: str, *, max_bytes: int = 1 << 20) -> bytes:
        return await self.inner.read_file(path, max_bytes=max_bytes)

    async def close(self) -> None:
        await self.inner.close()

    async def __aenter__(self) -> KilledSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


FILL_MEMORY = "dd if=/dev/zero of=/workspace/fill bs=1M count=200"
"""The writable layer lives in the sandbox's memory: this fills it, and the OOM killer ends dd."""


async def test_a_policy_that_exhausts_its_sandboxs_memory_is_trained_on_reward_0(
    echo_task: Task, provider: BwrapProvider, tokenizer: ByteTokenizer
) -> None:
    crashing = KillPid1Provider(provider, lambda sandbox, _: sandbox.stats().oom_kills > 0)
    policy = ScriptedPolicy([bash("pwd"), bash(FILL_MEMORY), bash("echo done"), bash("submit")])
    runner = RolloutRunner(
        crashing,
        LLMAgent(tokenizer),
        policy=policy,
        config=RunnerConfig(max_attempts=3, retry_backoff_s=0.01),
        image_for=TaskImages(provider),
    )
    result = await runner.run([echo_task])
    (t,) = result.trajectories
    assert t.error is not None, t
    assert (t.status, t.reward, t.passed) == ("agent_error", 0.0, False), t.error
    assert (t.error.kind, t.error.phase, t.error.error_code, t.error.retryable) == (
        "agent",
        "agent",
        "sandbox_crashed",
        False,
    )
    assert "OOM-killed" in t.error.message
    assert t.attempt == 1 and len(crashing.created) == 1  # not retried away
    # The OOM killer may pick pid 1 during the fill already; else it goes at the next command.
    assert [turn.command for turn in t.turns][:2] == ["pwd", FILL_MEMORY]
    assert t.trainable  # the policy's tokens are kept, to learn that this earns nothing
    # Beside a sibling that solved the task, it is a sample of reward 0 in the GRPO group, not dropped.
    solved = dataclasses.replace(t, episode_id=t.episode_id + "-sibling", status="completed", reward=1.0, error=None)
    adapted = batch_from_groups([[t, solved]])
    assert (adapted.infra_errors, adapted.untrainable) == (0, 0)
    assert sorted(s.reward for s in adapted.batch.samples) == [0.0, 1.0]


async def test_a_sandbox_killed_from_the_host_is_retried_and_never_trained(
    echo_task: Task, provider: BwrapProvider, tokenizer: ByteTokenizer
) -> None:
    crashing = KillPid1Provider(provider, lambda _, command: command == "echo done")
    policy = ScriptedPolicy([bash("pwd"), bash("echo done"), bash("submit")])
    t = await run_episode(
        echo_task, crashing, LLMAgent(tokenizer), policy=policy, image=await TaskImages(provider)(echo_task)
    )
    assert (t.status, t.reward) == ("infra_error", None)
    assert t.error is not None and (t.error.kind, t.error.error_code, t.error.retryable) == (
        "infra",
        "sandbox_closed",
        True,
    )
    assert "status 137" in t.error.message and not t.trainable
