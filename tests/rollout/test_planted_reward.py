"""Issue #18 (7): a process the agent leaves running replaces the reward file with a link to /dev/zero
after the verifier cleared its directory. The verifier's bounded read makes that the agent's failure
(reward 0), not a hang, not the host's memory, and not an infra error that would be retried away."""

from __future__ import annotations

import asyncio

from sandrl.inference.tokenizer import ByteTokenizer
from sandrl.rollout import LLMAgent, run_episode
from sandrl.rollout.images import TaskImages
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.tasks import Task

from .conftest import ScriptedPolicy, bash

PLANT = (
    "mkdir -p /logs/verifier && setsid sh -c "
    "'while :; do ln -sfn /dev/zero /logs/verifier/reward.txt 2>/dev/null; sleep 0.002; done' "
    ">/dev/null 2>&1 < /dev/null &"
)


async def test_a_reward_file_linked_to_dev_zero_scores_0(
    echo_task: Task, provider: BwrapProvider, tokenizer: ByteTokenizer
) -> None:
    policy = ScriptedPolicy([bash(PLANT), bash("submit")])
    image = await TaskImages(provider)(echo_task)
    t = await asyncio.wait_for(run_episode(echo_task, provider, LLMAgent(tokenizer), policy=policy, image=image), 60)
    assert t.status == "completed", t.error
    assert (t.reward, t.passed) == (0.0, False)
    assert t.verifier["infra_error"] is False
    assert "reward file cannot be read" in t.verifier["error"]


DELETE = (
    "mkdir -p /logs/verifier && setsid sh -c "
    "'while :; do rm -f /logs/verifier/reward.txt /logs/verifier/reward.json; sleep 0.002; done' "
    ">/dev/null 2>&1 < /dev/null &"
)


async def test_a_reward_file_a_leftover_process_deletes_scores_0(
    echo_task: Task, provider: BwrapProvider, tokenizer: ByteTokenizer
) -> None:
    """A missing reward with the agent's processes still alive is the agent's failure; without them
    it would be a broken test script (infra), and a policy could dodge every failing reward."""
    policy = ScriptedPolicy([bash(DELETE), bash("submit")])
    image = await TaskImages(provider)(echo_task)
    t = await asyncio.wait_for(run_episode(echo_task, provider, LLMAgent(tokenizer), policy=policy, image=image), 60)
    assert t.status == "completed", t.error
    assert (t.reward, t.passed) == (0.0, False)
    assert t.verifier["infra_error"] is False
    assert "left running" in t.verifier["error"]
