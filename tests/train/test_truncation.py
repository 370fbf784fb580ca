"""``[train] on_truncated``: what an episode that a budget cut short trains as, by its stop reason.

Hand-built trajectories, one of each kind a group can hold (finished, cut by each budget, failed
on the agent's side, failed on the machines' side), through :func:`batch_from_groups` as both
drivers call it, against advantages computed by hand from the rewards the policy should give.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from sandrl.errors import ConfigError
from sandrl.rollout.trajectory import Trajectory
from sandrl.train.adapter import batch_from_groups, to_sample
from sandrl.train.batch import samples_from_groups
from sandrl.train.run_config import from_dict, load_run_config, save_resolved
from sandrl.train.truncation import TruncationPolicy, overlong_shaping


def episode(
    index: int,
    reward: float | None,
    *,
    status: str = "completed",
    stop: str | None = "submitted",
    length: int = 10,
    segment_starts: list[int] | None = None,
) -> Trajectory:
    """Episode ``g/<index>`` of ``length`` ids, the first one the prompt, the rest the model's."""
    data: dict[str, Any] = {
        "episode_id": f"g/{index}",
        "group_id": "g",
        "task_id": "t",
        "sample_index": index,
        "agent": "llm",
        "status": status,
        "stop_reason": stop,
        "reward": reward,
        "ids": list(range(1, length + 1)),
        "loss_mask": [0] + [1] * (length - 1),
        "logprobs": [0.0] + [-0.5] * (length - 1),
        "weight_version": 0,
    }
    if segment_starts is not None:
        data["segment_starts"] = segment_starts
    return Trajectory.from_dict(data)


def every_kind() -> list[Trajectory]:
    """A finished episode, one cut by each budget, an agent error scored 0, an infra error."""
    return [
        episode(0, 1.0, length=90),
        episode(1, 1.0, status="truncated", stop="max_tokens", length=95),
        episode(2, 1.0, status="truncated", stop="max_turns", length=30),
        episode(3, 0.0, status="truncated", stop="wall_time", length=85),
        episode(4, 0.0, status="agent_error", stop="error", length=10),
        episode(5, None, status="infra_error", stop="error", length=10),
    ]


def advantages_of(rewards: list[float]) -> list[float]:
    """GRPO's, by hand: each reward minus the group's mean, over the group's (Bessel) spread + 1e-4."""
    mean = sum(rewards) / len(rewards)
    spread = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1))
    return [(r - mean) / (spread + 1e-4) for r in rewards]


@pytest.mark.parametrize(
    ("length", "budget", "buffer", "expected"),
    [
        (80, 100, 20, 0.0),  # |y| = L_max - L_cache: the last length without a penalty
        (81, 100, 20, -0.05),  # one token into the buffer: -1 / L_cache
        (90, 100, 20, -0.5),
        (99, 100, 20, -0.95),
        (100, 100, 20, -1.0),  # |y| = L_max
        (101, 100, 20, -1.0),  # over the budget
        (100, 100, 0, 0.0),  # no buffer: only what went over is punished
        (101, 100, 0, -1.0),
        (5, 10, 50, -0.5),  # a buffer wider than the budget ramps over all of it
        (0, 10, 50, 0.0),
    ],
)
def test_the_dapo_length_shaping_at_the_edges_of_its_buffer(
    length: int, budget: int, buffer: int, expected: float
) -> None:
    assert overlong_shaping(length, budget, buffer) == pytest.approx(expected, abs=1e-12)


def test_train_is_the_default_and_leaves_every_episode_as_before() -> None:
    group = every_kind()
    old = samples_from_groups([[to_sample(t) for t in group if t.trainable]])
    default = batch_from_groups([group])
    explicit = batch_from_groups([group], truncation=TruncationPolicy("train", token_budget=100))
    assert default.batch == old and explicit.batch == old
    assert [s.episode_id for s in old.samples] == ["g/0", "g/1", "g/2", "g/3", "g/4"]
    metrics = default.truncation.metrics()
    assert metrics["truncated_max_tokens"] == metrics["truncated_max_turns"] == metrics["truncated_wall_time"] == 1
    assert metrics["truncated_masked"] == metrics["truncated_penalised"] == metrics["overlong_shaped"] == 0
    assert metrics["overlong_penalty_mean"] == 0.0 and default.infra_errors == 1


def test_mask_keeps_a_truncated_episode_in_its_groups_baseline_but_out_of_the_gradient() -> None:
    adapted = batch_from_groups([every_kind()], truncation=TruncationPolicy("mask"))
    # Advantages over all five verified rewards, then the three truncated episodes leave the batch.
    expected = advantages_of([1.0, 1.0, 1.0, 0.0, 0.0])
    samples = {s.episode_id: s for s in adapted.batch.samples}
    assert sorted(samples) == ["g/0", "g/4"]
    assert samples["g/0"].advantage == pytest.approx(expected[0])
    assert samples["g/4"].advantage == pytest.approx(expected[4])
    assert samples["g/0"].loss_mask == tuple([0] + [1] * 89) and samples["g/0"].reward == 1.0
    assert adapted.batch.reward_mean == pytest.approx(3 / 5) and adapted.infra_errors == 1
    metrics = adapted.truncation.metrics()
    assert metrics["truncated_masked"] == 3
    assert metrics["truncated_masked_max_tokens"] == metrics["truncated_masked_max_turns"] == 1
    assert metrics["truncated_masked_wall_time"] == 1 and metrics["truncated_penalised"] == 0


def test_mask_acts_only_on_the_budgets_it_is_given() -> None:
    policy = TruncationPolicy("mask", truncated_by=("wall_time",))
    adapted = batch_from_groups([every_kind()], truncation=policy)
    assert [s.episode_id for s in adapted.batch.samples] == ["g/0", "g/1", "g/2", "g/4"]
    assert adapted.truncation.metrics()["truncated_masked"] == 1
    assert adapted.truncation.metrics()["truncated_max_tokens"] == 1  # counted, trained


def test_penalty_shapes_by_length_penalises_the_token_and_turn_budgets_and_masks_the_time_budget() -> None:
    policy = TruncationPolicy("penalty", overlong_buffer=20, overlong_penalty=0.5, token_budget=100)
    adapted = batch_from_groups([every_kind()], truncation=policy)
    shaped = [
        1.0 - 0.5 * 0.5,  # finished at 90 ids: half-way into the buffer
        1.0 - 0.5,  # cut by the token budget: the whole penalty, whatever its length
        1.0 - 0.5,  # cut by the turn budget: the whole penalty
        0.0 - 0.5 * 0.25,  # cut by the time budget at 85 ids: shaped as any other, then masked
        0.0,  # an agent error of 10 ids: far from the budget
    ]
    expected = advantages_of(shaped)
    samples = {s.episode_id: s for s in adapted.batch.samples}
    assert sorted(samples) == ["g/0", "g/1", "g/2", "g/4"]
    for index in (0, 1, 2, 4):
        assert samples[f"g/{index}"].reward == pytest.approx(shaped[index])
        assert samples[f"g/{index}"].advantage == pytest.approx(expected[index])
    assert adapted.batch.reward_mean == pytest.approx(3 / 5)  # the verifier's, as the step reports it
    metrics = adapted.truncation.metrics()
    assert metrics["truncated_penalised_max_tokens"] == metrics["truncated_penalised_max_turns"] == 1
    assert metrics["truncated_penalised_wall_time"] == 1 and metrics["truncated_masked_wall_time"] == 1
    assert metrics["truncated_masked"] == 1 and metrics["truncated_penalised"] == 3
    assert metrics["overlong_shaped"] == 1  # the finished episode in the buffer
    assert metrics["overlong_penalty_mean"] == pytest.approx(sum(shaped) / 5 - 3 / 5)


def test_penalty_without_the_token_budget_shapes_no_length() -> None:
    policy = TruncationPolicy("penalty", truncated_by=("max_turns", "wall_time"), overlong_penalty=0.5)
    adapted = batch_from_groups([every_kind()], truncation=policy)
    rewards = {s.episode_id: s.reward for s in adapted.batch.samples}
    assert rewards == {"g/0": 1.0, "g/1": 1.0, "g/2": 0.5, "g/4": 0.0}


def test_a_group_whose_only_difference_is_a_penalty_is_trained() -> None:
    group = [episode(0, 0.0, length=20), episode(1, 0.0, status="truncated", stop="max_tokens", length=100)]
    assert batch_from_groups([group]).batch.zero_signal_groups == 1
    adapted = batch_from_groups([group], truncation=TruncationPolicy("penalty", overlong_buffer=20, token_budget=100))
    assert adapted.batch.zero_signal_groups == 0
    assert [s.advantage > 0 for s in adapted.batch.samples] == [True, False]
    assert adapted.batch.reward_mean == 0.0


def test_the_length_shaped_is_the_longest_segment_the_model_saw() -> None:
    """A harness that re-sent its history: the budget bounds each request, not the ids end to end."""
    split = episode(0, 1.0, length=120, segment_starts=[0, 60])
    group = [split, episode(1, 0.0, length=10)]
    policy = TruncationPolicy("penalty", overlong_buffer=20, token_budget=100)
    adapted = batch_from_groups([group], truncation=policy)
    parts = [s for s in adapted.batch.samples if s.episode_id == "g/0"]
    assert len(parts) == 2 and all(p.reward == 1.0 for p in parts)
    longer = episode(0, 1.0, length=180, segment_starts=[0, 90])
    samples = batch_from_groups([[longer, group[1]]], truncation=policy).batch.samples
    parts = [s for s in samples if s.episode_id == "g/0"]
    assert len(parts) == 2 and all(p.reward == pytest.approx(0.5) for p in parts)
    assert parts[0].advantage == parts[1].advantage > 0


def _config(train: dict[str, Any], rollout: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"tasks": {"family": "echo"}, "rollout": {"max_total_tokens": 1024, **(rollout or {})}, "train": train}


@pytest.mark.parametrize(
    ("train", "rollout", "needle"),
    [
        ({"on_truncated": "drop"}, None, "[train] on_truncated must be one of 'train', 'mask', 'penalty', got 'drop'"),
        ({"truncated_by": ["max_time"]}, None, "[train] truncated_by[0] must be one of 'max_tokens', 'max_turns'"),
        ({"on_truncated": "mask", "truncated_by": []}, None, "truncated_by is empty, so on_truncated = 'mask' acts"),
        ({"overlong_buffer": -1}, None, "[train]: overlong_buffer must be a number of tokens >= 0"),
        ({"overlong_penalty": 0}, None, "[train]: overlong_penalty must be a finite number > 0 (DAPO: 1.0), got 0.0"),
        ({"overlong_penalty": "big"}, None, "[train] overlong_penalty must be a number, got a string"),
        (
            {"on_truncated": "penalty"},
            None,
            "[train] overlong_buffer (4096) must be less than [rollout] max_total_tokens (1024), the token budget "
            "the penalty ramps up to: DAPO uses a fifth of it (204)",
        ),
        (
            {"on_truncated": "mask"},
            {"max_turns": 1},
            "[train] on_truncated = 'mask' with [rollout] max_turns = 1: every episode that runs a command ends by "
            "its turn budget, and would be masked; leave 'max_turns' out of [train] truncated_by",
        ),
        ({"on_truncated": "penalty", "overlong_buffer": 256}, {"max_turns": 1}, "submitting without acting"),
    ],
)
def test_bad_truncation_settings_are_refused_in_one_line(
    train: dict[str, Any], rollout: dict[str, Any] | None, needle: str
) -> None:
    with pytest.raises(ConfigError) as info:
        from_dict(_config(train, rollout), where="run.toml")
    message = str(info.value)
    assert needle in message and message.startswith("run.toml: ") and "\n" not in message


def test_the_settings_read_back_and_the_budget_is_the_one_the_agent_loop_enforces(tmp_path: Path) -> None:
    train = {"on_truncated": "penalty", "truncated_by": ["max_tokens"], "overlong_buffer": 256, "overlong_penalty": 0.5}
    config = from_dict(_config(train, {"max_turns": 1}), where="run.toml")
    assert load_run_config(save_resolved(config, tmp_path / "config.toml")).train == config.train
    policy = config.truncation()
    assert (policy.on_truncated, policy.truncated_by, policy.token_budget) == ("penalty", ("max_tokens",), 1024)
    assert config.truncation(max_context=512).token_budget == 512  # the runner caps the budget at the context
    assert from_dict(_config({}), where="run.toml").truncation().on_truncated == "train"


def test_a_penalty_on_length_needs_the_token_budget() -> None:
    with pytest.raises(ConfigError, match="give it the rollout's budget"):
        TruncationPolicy("penalty")
    TruncationPolicy("penalty", truncated_by=("max_turns",))  # no length to shape: no budget needed
