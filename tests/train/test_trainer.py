"""Trainer.step and sft_step on the tiny model: masks honoured, invariances, export to the engine."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from sandrl.errors import ConfigError, TrainError
from sandrl.inference.base import SamplingParams
from sandrl.inference.engine import Engine, EngineConfig
from sandrl.inference.model import build_tiny_model
from sandrl.train.batch import Batch, TrainSample, samples_from_groups
from sandrl.train.config import TrainConfig
from sandrl.train.losses import LossConfig

from .helpers import TINY, make_trainer, same_tensors, sample, state_of

NO_TIS = LossConfig(tis_cap=None)


def _group() -> list[TrainSample]:
    return [
        sample("pick a letter", out, reward=r, group_id="q")
        for out, r in (("abc", 1.0), ("x!", 0.0), ("hello world", 1.0), ("?", 0.0))
    ]


def test_a_batch_with_an_all_zero_loss_mask_changes_nothing() -> None:
    trainer = make_trainer(TrainConfig(lr=1e-2, weight_decay=0.1, loss=NO_TIS))
    before = state_of(trainer.model)
    samples = [sample("p", out, advantage=a, masked=False) for out, a in (("abc", 1.0), ("de", -1.0))]
    metrics = trainer.step(samples)
    assert same_tensors(before, state_of(trainer.model))  # not even weight decay
    assert trainer.optimizer.state_dict()["state"] == {}
    assert (trainer.version, metrics["updates"], metrics["tokens"]) == (0, 0.0, 0.0)
    assert trainer.steps == 1
    assert all(p.grad is None for p in trainer.model.parameters())


def test_groups_without_signal_are_reported_and_not_trained() -> None:
    trainer = make_trainer(TrainConfig(loss=NO_TIS))
    before = state_of(trainer.model)
    same = [sample("q", "a", reward=1.0, group_id="q") for _ in range(3)]
    metrics = trainer.step(samples_from_groups([same]))
    assert same_tensors(before, state_of(trainer.model))
    assert (metrics["groups"], metrics["zero_signal_groups"], metrics["zero_signal_samples"]) == (1.0, 1.0, 3.0)
    assert metrics["reward_mean"] == 1.0 and trainer.version == 0


def test_a_step_with_signal_updates_and_bumps_the_version() -> None:
    trainer = make_trainer(TrainConfig(loss=NO_TIS))
    before = state_of(trainer.model)
    metrics = trainer.step(samples_from_groups([_group()]))
    assert not same_tensors(before, state_of(trainer.model))
    assert trainer.version == 1 and metrics["weight_version"] == 1.0 and metrics["updates"] == 1.0
    assert metrics["grad_norm"] > 0 and metrics["tokens"] == sum(s.num_model_tokens for s in _group())


def test_the_micro_batch_budget_does_not_change_the_update() -> None:
    batch = samples_from_groups([_group()])
    whole = make_trainer(TrainConfig(lr=1e-2, micro_batch_tokens=10_000, loss=NO_TIS))
    pieces = make_trainer(TrainConfig(lr=1e-2, micro_batch_tokens=8, loss=NO_TIS))  # one sample per forward
    m_whole, m_pieces = whole.step(batch), pieces.step(batch)
    assert m_whole["tokens"] == m_pieces["tokens"]
    assert m_whole["grad_norm"] == pytest.approx(m_pieces["grad_norm"], rel=1e-4)
    a, b = state_of(whole.model), state_of(pieces.model)
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_importance_correction_is_one_when_trainer_and_rollout_log_probs_match() -> None:
    batch = samples_from_groups([_group()])
    probe = make_trainer()
    own = probe.logprobs(batch.samples)
    on_policy = Batch.of(replace(s, rollout_logprobs=tuple(lp)) for s, lp in zip(batch.samples, own, strict=True))
    corrected = make_trainer(TrainConfig(lr=1e-2, loss=LossConfig(tis_cap=2.0)))
    plain = make_trainer(TrainConfig(lr=1e-2, loss=NO_TIS))
    metrics = corrected.step(on_policy)
    plain.step(on_policy)
    assert metrics["is_weight_mean"] == 1.0 and metrics["is_truncated_frac"] == 0.0
    assert same_tensors(state_of(corrected.model), state_of(plain.model))


def test_stale_rollout_log_probs_are_corrected_and_truncated() -> None:
    batch = samples_from_groups([_group()])
    probe = make_trainer()
    own = probe.logprobs(batch.samples)
    # The sampler gave each model token half the probability the trainer gives it: weight 2, at the cap.
    stale = [
        replace(s, rollout_logprobs=tuple(lp - 0.6931 if m else 0.0 for lp, m in zip(lps, s.loss_mask, strict=True)))
        for s, lps in zip(batch.samples, own, strict=True)
    ]
    metrics = make_trainer(TrainConfig(loss=LossConfig(tis_cap=1.5))).step(Batch.of(stale))
    assert metrics["is_weight_mean"] == pytest.approx(1.5)
    assert metrics["is_truncated_frac"] == 1.0


def test_what_masked_positions_hold_does_not_matter() -> None:
    batch = samples_from_groups([_group()])
    noisy = Batch.of(
        replace(
            s,
            rollout_logprobs=tuple(
                lp if m else 1e6 for lp, m in zip(s.rollout_logprobs or (), s.loss_mask, strict=True)
            ),
        )
        for s in batch.samples
    )
    a = make_trainer(TrainConfig(loss=LossConfig(tis_cap=2.0, beta=0.1)))
    b = make_trainer(TrainConfig(loss=LossConfig(tis_cap=2.0, beta=0.1)))
    a.step(batch)
    b.step(noisy)
    assert same_tensors(state_of(a.model), state_of(b.model))


def test_importance_sampling_without_rollout_log_probs_is_a_clear_error() -> None:
    s = TrainSample(token_ids=(1, 2, 3), loss_mask=(0, 1, 1), advantage=1.0)
    with pytest.raises(TrainError, match="needs each sample's rollout_logprobs"):
        make_trainer().step([s])


def test_minibatches_take_several_updates_against_the_proximal_policy() -> None:
    trainer = make_trainer(TrainConfig(lr=5e-2, minibatches=2, loss=LossConfig(tis_cap=None, epsilon_high=0.01)))
    metrics = trainer.step(samples_from_groups([_group()]))
    assert trainer.version == 2 and metrics["updates"] == 2.0
    assert metrics["clip_high_frac"] > 0  # the second update sees ratios moved by the first


def test_the_kl_reference_stays_frozen_and_the_penalty_appears_once_the_policy_moves() -> None:
    trainer = make_trainer(TrainConfig(lr=5e-2, loss=LossConfig(beta=0.1, tis_cap=None)))
    assert trainer.reference is not None
    frozen = state_of(trainer.reference)
    first = trainer.step(samples_from_groups([_group()]))
    second = trainer.step(samples_from_groups([_group()]))
    assert first["kl_mean"] == 0.0 and second["kl_mean"] > 0
    assert same_tensors(frozen, state_of(trainer.reference))


def test_sft_steps_learn_the_demonstrations_and_only_their_model_tokens() -> None:
    trainer = make_trainer(TrainConfig(lr=1e-2))
    demos = [sample("say hi", "hi there"), sample("say ok", "ok")]
    losses = [trainer.sft_step(demos)["loss"] for _ in range(15)]
    assert losses[-1] < 0.5 * losses[0]
    before = state_of(trainer.model)
    trainer.sft_step([sample("say hi", "hi there", masked=False)])
    assert same_tensors(before, state_of(trainer.model))


def test_warmup_raises_the_learning_rate_linearly() -> None:
    trainer = make_trainer(TrainConfig(lr=1e-3, warmup_steps=4))
    assert [trainer.lr_at(i) for i in range(6)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])


def test_cosine_decay_anneals_from_the_peak_to_the_floor_after_warmup_and_stays() -> None:
    trainer = make_trainer(TrainConfig(lr=1e-3, warmup_steps=2, decay_steps=4, min_lr_ratio=0.1))
    got = [trainer.lr_at(i) for i in range(9)]
    mid = 1e-4 + 0.9e-3 * 0.5  # half way through the cosine
    assert got[:3] == pytest.approx([5e-4, 1e-3, 1e-3])
    assert got[4] == pytest.approx(mid)
    assert got[6:] == pytest.approx([1e-4] * 3)
    assert got[2] > got[3] > got[4] > got[5] > got[6]
    with pytest.raises(ConfigError, match="decay_steps"):
        TrainConfig(decay_steps=-1)
    with pytest.raises(ConfigError, match="min_lr_ratio"):
        TrainConfig(min_lr_ratio=2.0)


async def test_exported_weights_load_into_the_engine_and_bump_its_version(tmp_path: Path) -> None:
    trainer = make_trainer(TrainConfig(lr=1e-2, loss=NO_TIS))
    trainer.step(samples_from_groups([_group()]))
    trainer.step(samples_from_groups([_group()]))
    exported = trainer.export_weights(tmp_path / "weights")
    assert exported.version == 2 and exported.path.name == "weights-v00000002"
    served, tokenizer = build_tiny_model(TINY)
    engine = Engine(served, tokenizer, config=EngineConfig(num_threads=1))
    try:
        assert engine.weight_version == 0
        version = await engine.update_weights_from_disk(str(exported.path), version=exported.version)
        assert version == engine.weight_version == 2
        assert same_tensors(state_of(engine.model), state_of(trainer.model))
        # and it serves: the engine's log-probs are the trainer's, up to batching numerics
        probe = sample("pick a letter", "")
        prompt = list(probe.token_ids)
        gen = await engine.generate(prompt, SamplingParams(max_new_tokens=4, seed=1, ignore_eos=True))
        assert gen.weight_version == 2
        full = TrainSample(token_ids=(*prompt, *gen.output_ids), loss_mask=(0,) * len(prompt) + (1,) * 4)
        mine = trainer.logprobs([full])[0][len(prompt) :]
        assert mine == pytest.approx(gen.output_logprobs, abs=1e-4)
    finally:
        await engine.aclose()
