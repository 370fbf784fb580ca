"""Issue #18 (7): a process the agent leaves running replaces the reward file with a link to /dev/zero,
or deletes it, after the verifier cleared its directory. Either is the agent's failure (reward 0): not
a hang, not the host's memory, and not an infra error that would be retried away."""

from __future__ import annotations

import asyncio

import pytest

from sandrl.inference.tokenizer import ByteTokenizer
from sandrl.rollout import LLMAgent, run_episode
from sandrl.rollout.images import TaskImages
from sandrl.sandbox.base import SandboxSpec
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.tasks import Task
from sandrl.tasks.verify import LEFTOVERS

from .conftest import ScriptedPolicy, bash

PLANT = (
    "mkdir -p /logs/verifier && setsid sh -c "
    "'while :; do ln -sfn /dev/zero /logs/verifier/reward.txt 2>/dev/null; sleep 0.002; done' "
    ">/dev/null 2>&1 < /dev/null &"
)
DELETE = (
    "mkdir -p /logs/verifier && setsid sh -c "
    "'while :; do rm -f /logs/verifier/reward.txt /logs/verifier/reward.json; sleep 0.002; done' "
    ">/dev/null 2>&1 < /dev/null &"
)
"""A missing reward with the agent's processes still alive is the agent's failure; without them it
would be a broken test script (infra), and a policy could dodge every failing reward this way."""


@pytest.mark.parametrize(
    ("plant", "error"), [(PLANT, "reward file cannot be read"), (DELETE, "left running")], ids=["link", "delete"]
)
async def test_what_a_leftover_process_does_to_the_reward_scores_0(
    echo_task: Task, provider: BwrapProvider, tokenizer: ByteTokenizer, plant: str, error: str
) -> None:
    image = await TaskImages(provider)(echo_task)
    # The planted loop races the verifier (every 2 ms): on a loaded box the verifier may read the
    # honest reward (0, the task undone) before the loop strikes. That is scored right too; the
    # episode runs again, up to three times, until the loop wins and its handling is what is checked.
    for _ in range(3):
        policy = ScriptedPolicy([bash(plant), bash("submit")])
        episode = run_episode(echo_task, provider, LLMAgent(tokenizer), policy=policy, image=image)
        t = await asyncio.wait_for(episode, 60)
        assert t.status == "completed", t.error
        assert (t.reward, t.passed) == (0.0, False)
        assert t.verifier["infra_error"] is False
        if t.verifier["error"] is not None:
            break
    assert error in t.verifier["error"]


async def test_the_leftover_count_sees_only_what_the_agent_left(provider: BwrapProvider) -> None:
    async with await provider.create(SandboxSpec(ttl_s=60)) as sb:
        assert (await sb.exec(LEFTOVERS)).stdout == "0\n"
        await sb.exec("setsid sleep 60 >/dev/null 2>&1 < /dev/null &")
        assert (await sb.exec(LEFTOVERS)).stdout == "1\n"
