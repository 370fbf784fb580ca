"""Harbor's Terminus-2 (unchanged, in Harbor's own virtualenv) as a sandrl agent: its LLM calls through
a gateway session, its tmux terminal in the episode's own sandbox (lent to it over loopback), its
trajectory the session's, token-exact."""

from __future__ import annotations

import json

import pytest

from sandrl.inference.base import Generation, SamplingParams
from sandrl.inference.engine import Engine, EngineConfig
from sandrl.inference.tiny_config import TinyModelConfig
from sandrl.inference.tokenizer import ByteTokenizer
from sandrl.rollout import Budget, EpisodeConfig, run_episode
from sandrl.rollout.agents.terminus import HARBOR_PYTHON_ENV
from sandrl.sandbox.bwrap import BwrapProvider
from sandrl.tasks import Task
from sandrl.wiring import RolloutConfig, open_agent

from ..harbor_venv import harbor_venv
from .conftest import answer_of
from .test_harness_agent import ScriptedWithTokenizer, assert_token_exact

TERMINUS = "sandrl.rollout.agents.terminus:run"
CONTEXT = 8192
"""Terminus-2's own prompt is about 3,000 characters: the byte-level tiny model gets this many positions."""


@pytest.fixture(autouse=True)
def harbor_python(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HARBOR_PYTHON_ENV, str(harbor_venv() / "bin" / "python"))


def reply(commands: list[str], complete: bool) -> str:
    """A reply in Terminus-2's JSON format."""
    keystrokes = [{"keystrokes": c + "\n", "duration": 0.2} for c in commands]
    body = {"analysis": "The file is missing.", "plan": "Write it.", "commands": keystrokes, "task_complete": complete}
    return json.dumps(body)


async def test_terminus_2_solves_a_task_through_the_gateway(echo_task: Task, provider: BwrapProvider) -> None:
    word = answer_of(echo_task)
    policy = ScriptedWithTokenizer([reply([f"echo {word} > /workspace/answer.txt"], True), reply([], True)])
    rollout = RolloutConfig(agent=TERMINUS, max_turns=4, max_total_tokens=CONTEXT, max_new_tokens=256)
    async with open_agent(rollout, policy) as agent:  # type: ignore[arg-type]
        config = EpisodeConfig(Budget(max_turns=4, max_total_tokens=CONTEXT))
        t = await run_episode(echo_task, provider, agent, policy=policy, config=config)  # type: ignore[arg-type]
    assert t.status == "completed" and t.reward == 1.0 and t.stop_reason == "submitted", t.error
    assert t.num_turns == 2 and t.segment_starts == [0]  # the completion, then its confirmation
    assert_token_exact(t, policy)
    text = ByteTokenizer().decode(t.ids)
    assert "task_complete" in text[: t.prompt_len] and f"echo {word}" in text  # its prompt, its terminal


async def test_terminus_2_with_the_tiny_model(
    echo_task: Task, provider: BwrapProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tiny model writes no valid reply (Terminus-2 tells it so), the turn budget ends the episode,
    every token is recorded as the model saw and wrote it, and nothing is an infra error."""
    engine = Engine.load("tiny", EngineConfig(seed=0, tiny=TinyModelConfig(max_position_embeddings=CONTEXT)))
    seen: list[list[int]] = []
    generate = engine.generate

    async def recorded(input_ids: list[int], params: SamplingParams) -> Generation:
        seen.append(list(input_ids))
        return await generate(input_ids, params)

    monkeypatch.setattr(engine, "generate", recorded)
    try:
        rollout = RolloutConfig(agent=TERMINUS, max_turns=2, max_total_tokens=CONTEXT, max_new_tokens=32)
        async with open_agent(rollout, engine) as agent:
            config = EpisodeConfig(Budget(max_turns=2, max_total_tokens=CONTEXT))
            t = await run_episode(echo_task, provider, agent, policy=engine, config=config)
    finally:
        engine.close()
    assert t.status in ("completed", "truncated") and t.error is None, t.error
    assert t.num_turns == 2 and t.segment_starts == [0]
    t.check()  # ids, loss mask, log-probs and turns agree
    for turn, ids in zip(t.turns, seen, strict=True):
        assert ids == t.ids[: turn.output_start]  # the engine's input was exactly the recorded prefix
    assert sum(t.loss_mask) == sum(turn.output_end - turn.output_start for turn in t.turns) > 0
    assert t.weight_version == 0
