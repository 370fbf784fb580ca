"""The small pieces: command parsing, observation cutting, trajectory JSON, budgets."""

from __future__ import annotations

import math

import pytest

from sandrl.errors import ConfigError
from sandrl.inference.chat import ChatFormat
from sandrl.inference.tokenizer import ByteTokenizer
from sandrl.rollout import Budget, EpisodeError, Timings, Trajectory, Turn
from sandrl.rollout.agents.fenced import parse_action
from sandrl.rollout.agents.observation import cut, render, split_budget
from sandrl.rollout.jsonl import dumps, loads
from sandrl.sandbox.base import ExecResult


@pytest.mark.parametrize(
    ("reply", "kind", "command"),
    [
        ("```bash\nls -la\n```", "command", "ls -la"),
        ("first\n```sh\ncd /x && make\n```\nthen ```bash\nrm\n```", "command", "cd /x && make"),
        ("```bash\nsubmit\n```<|im_end|>", "submit", None),
        ("```bash\n  \n```", "none", None),
        ("ls -la", "none", None),
        ("```python\nprint(1)\n```", "none", None),
        ("```bash\nunclosed", "none", None),
    ],
)
def test_parse_action(reply: str, kind: str, command: str | None) -> None:
    action = parse_action(reply)
    assert (action.kind, action.command) == (kind, command)


def test_cut_keeps_head_and_tail_within_budget() -> None:
    chat = ChatFormat(ByteTokenizer())
    text = "".join(f"{i}\n" for i in range(1000))
    short, was_cut = cut(chat, text, 100)
    assert was_cut and short.startswith("0\n1\n2\n") and short.endswith("998\n999\n")
    assert len(chat.encode(short)) < 100 + 40
    assert cut(chat, "small", 100) == ("small", False)


def test_split_budget_gives_unused_share_away() -> None:
    assert split_budget(10, 10, 100) == (10, 10)
    assert split_budget(500, 10, 100) == (90, 10)
    assert split_budget(10, 500, 100) == (10, 90)
    assert split_budget(500, 500, 100) == (50, 50)


def test_render_observation() -> None:
    chat = ChatFormat(ByteTokenizer())
    shown = render(chat, ExecResult(124, "partial\n", "", 2.0, timed_out=True), 64)
    assert shown.text.startswith("exit code: 124\n(the command timed out after 2.0 s")
    assert "stdout:\npartial" in shown.text and "stderr" not in shown.text and not shown.truncated


def test_trajectory_json_round_trip_is_exact() -> None:
    t = Trajectory(
        episode_id="r/t#0/1",
        group_id="r/t#0",
        task_id="t",
        sample_index=1,
        agent="llm",
        status="truncated",
        stop_reason="max_turns",
        reward=0.5,
        passed=False,
        attempt=2,
        ids=[1, 2, 3, 4],
        loss_mask=[0, 1, 1, 0],
        logprobs=[0.0, -1e-300, -0.1 - 0.2, -math.pi],
        prompt_len=1,
        turns=[Turn(0, "ls", 1, 3, 1, "stop", 5, 4, 0, model_s=0.1, observation_start=3, observation_end=4)],
        weight_version=4,
        timings=Timings(queue_s=0.25, total_s=1 / 3),
        retried_errors=[EpisodeError("infra", "agent", "inference_unreachable", "down", True)],
        verifier={"exit_code": 1, "details": {"tests": {"a": "passed"}}},
        sandbox_id="sb-1",
        image="host",
        started_at=1.7e9 + 0.123456789,
    )
    t.check()
    again = loads(dumps(t))
    assert again == t and again.logprobs[2] == -0.1 - 0.2
    assert again.weight_versions == [4, 5] and again.completion_ids() == [2, 3]
    assert again.token_weight_versions() == [None, 5, 5, None]
    with pytest.raises(ValueError, match="unknown trajectory fields"):
        Trajectory.from_dict({**t.to_dict(), "surprise": 1})


def test_budget_validation() -> None:
    for bad in ({"max_turns": 0}, {"max_total_tokens": 0}, {"wall_time_s": -1.0}):
        with pytest.raises(ConfigError):
            Budget(**bad)  # type: ignore[arg-type]


def test_token_weight_versions_are_exact_when_a_turn_spans_an_update() -> None:
    split = Turn(0, None, 1, 4, 1, "length", 6, 5, output_weight_versions=[5, 5, 6])
    whole = Turn(1, None, 5, 7, 5, "stop", 6, 6, observation_start=4, observation_end=5)
    t = Trajectory(
        episode_id="r/t#0/0",
        group_id="r/t#0",
        task_id="t",
        sample_index=0,
        agent="llm",
        status="completed",
        ids=[1, 2, 3, 4, 9, 7, 8],
        loss_mask=[0, 1, 1, 1, 0, 1, 1],
        logprobs=[0.0, -0.1, -0.2, -0.3, 0.0, -0.4, -0.5],
        prompt_len=1,
        turns=[split, whole],
        weight_version=5,
    )
    t.check()
    assert t.token_weight_versions() == [None, 5, 5, 6, None, 6, 6]
    assert t.weight_versions == [5, 6]
    assert loads(dumps(t)).token_weight_versions() == t.token_weight_versions()
    # A record whose per-token list does not match its span falls back to the turn's version.
    assert Turn(0, None, 1, 3, 1, "stop", 6, 5, output_weight_versions=[5]).token_versions() == [6, 6]
