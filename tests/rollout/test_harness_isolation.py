"""Two harness episodes at once behind one runner's gateway: each harness's key is its own session's, and
with it one episode can neither open sessions nor read or write the other's (real sandboxes, real HTTP)."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from sandrl.rollout import run_episode
from sandrl.rollout.agents.harness import HarnessContext
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.tasks import Task
from sandrl.wiring import RolloutConfig, open_agent

from .test_harness_agent import ScriptedWithTokenizer

pytest.importorskip("openai")

CONTEXTS: list[HarnessContext] = []
PROBES: dict[str, dict[str, int]] = {}


async def probing_harness(ctx: HarnessContext) -> str:
    """Chats once with its own key, then tries its key on everything else the gateway might answer."""
    CONTEXTS.append(ctx)
    async with openai.AsyncOpenAI(base_url=ctx.base_url, api_key=ctx.api_key, max_retries=0) as client:
        await client.chat.completions.create(
            model=ctx.model, messages=[{"role": "user", "content": ctx.task.instruction}], max_tokens=8
        )
    for _ in range(500):  # the other episode's harness is running too
        if len(CONTEXTS) == 2:
            break
        await asyncio.sleep(0.02)
    other = next(c for c in CONTEXTS if c is not ctx)
    root = ctx.base_url.split("/v1/sessions/")[0]
    chat = {"model": ctx.model, "messages": [{"role": "user", "content": "forged"}]}
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {ctx.api_key}"}, timeout=30) as http:
        PROBES[ctx.session.id] = {
            "open": (await http.post(f"{root}/v1/sessions")).status_code,
            "chat_other": (await http.post(f"{other.base_url}/chat/completions", json=chat)).status_code,
            "read_other": (await http.get(other.base_url)).status_code,
            "close_other": (await http.delete(other.base_url)).status_code,
            "chat_own_without_key": (
                await http.post(f"{ctx.base_url}/chat/completions", json=chat, headers={"Authorization": ""})
            ).status_code,
        }
    await asyncio.sleep(0.2)  # both have probed before either episode ends and closes its session
    return "done"


async def test_one_episodes_harness_cannot_reach_anothers_session(echo_task: Task, provider: BwrapProvider) -> None:
    CONTEXTS.clear()
    PROBES.clear()
    policy = ScriptedWithTokenizer(["looking"])
    async with open_agent(RolloutConfig(agent=f"{__name__}:probing_harness"), policy) as agent:  # type: ignore[arg-type]
        trajectories = await asyncio.gather(
            *(run_episode(echo_task, provider, agent, policy=policy) for _ in range(2))  # type: ignore[arg-type]
        )
    assert all(t.status == "completed" and t.error is None for t in trajectories), [t.error for t in trajectories]
    assert len(PROBES) == 2 and CONTEXTS[0].api_key != CONTEXTS[1].api_key
    for probes in PROBES.values():
        assert probes["open"] in (404, 405), probes  # the runner's gateway has no open route
        assert probes["chat_other"] == probes["read_other"] == probes["close_other"] == 401, probes
        assert probes["chat_own_without_key"] == 401, probes
    # Each trajectory holds its own one turn: nothing was forged into it.
    assert [len(t.turns) for t in trajectories] == [1, 1]
    assert len(policy.calls) == 2
