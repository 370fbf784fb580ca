"""The learning-signal options through a real Trainer step: packed rows, the entropy bonus, and the
step's metrics split by cause (staleness, stop reason)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from sandrl.train.batch import Batch, TrainSample
from sandrl.train.config import TrainConfig
from sandrl.train.diagnostics import causes
from sandrl.train.loss_config import ImportanceConfig, LossConfig

from .helpers import make_trainer, sample


def _batch(version: int = 0) -> list[TrainSample]:
    """Eight samples of varied lengths: half on the current weights, half two versions behind, half cut
    by the token budget; their rollout log-probs a little off the trainer's."""
    out = []
    for i in range(8):
        s = sample("p" * (3 + i), "answer"[: 2 + i % 5], advantage=(-1.0) ** i)
        out.append(
            dataclasses.replace(
                s,
                rollout_logprobs=tuple(-0.1 * (i % 3) for _ in s.token_ids),
                weight_version=version - 2 * (i % 2),
                stop_reason="max_tokens" if i < 4 else "submitted",
            )
        )
    return out


LOSSES = [
    LossConfig(),
    LossConfig(estimator="gspo", tis_cap=None),
    LossConfig(estimator="gspo", importance=ImportanceConfig(level="geometric", mode="mask", band=(0.5, 1.5))),
    LossConfig(estimator="cispo", importance=ImportanceConfig(level="sequence", mode="truncate", band=(0.0, 3.0))),
]


@pytest.mark.parametrize("loss", LOSSES, ids=["ppo", "gspo", "gspo-geometric-mask", "cispo-sequence"])
def test_packed_rows_train_each_estimator_as_padded_rows_do(loss: LossConfig) -> None:
    """Sequence-level ratios see each sample whole in a packed row (the trainer passes sample ids)."""
    config = TrainConfig(lr=1e-2, micro_batch_tokens=4096, minibatches=2, loss=loss)
    packed, padded = make_trainer(config), make_trainer(dataclasses.replace(config, packing=False))
    batch = _batch()
    a, b = packed.step(batch), padded.step(batch)
    assert packed.row_tokens == 4096 and a["padding_frac"] < b["padding_frac"]
    for key in ("grad_norm", "loss", "clip_low_frac", "clip_high_frac", "is_masked_frac", "mismatch_kl"):
        assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-7), key


def test_an_entropy_bonus_moves_the_update_and_reports_the_same_entropy() -> None:
    batch = _batch()
    plain = make_trainer(TrainConfig(lr=1e-2))
    bonus = make_trainer(TrainConfig(lr=1e-2, loss=LossConfig(entropy_coef=0.5)))
    a, b = plain.step(batch), bonus.step(batch)
    assert a["entropy_mean"] == pytest.approx(b["entropy_mean"], rel=1e-6)  # measured before the update
    assert b["grad_norm"] != pytest.approx(a["grad_norm"], rel=1e-3)
    # The bonus raises the entropy: the next forward of the same batch has more of it than without.
    assert bonus.step(batch)["entropy_mean"] > plain.step(batch)["entropy_mean"]


def test_metrics_split_by_staleness_and_stop_reason_add_up_to_the_batch() -> None:
    trainer = make_trainer(TrainConfig(lr=1e-2, loss=LossConfig(importance=ImportanceConfig(mode="mask"))))
    trainer.version = 2
    batch = _batch(version=2)
    assert {causes(s, 2) for s in batch} == {
        ("stale_0", "stop_max_tokens"),
        ("stale_2", "stop_max_tokens"),
        ("stale_0", "stop_submitted"),
        ("stale_2", "stop_submitted"),
    }
    m = trainer.step(Batch.of(batch))
    stale = ["stale_0", "stale_2"]
    assert [m[f"{k}/samples"] for k in stale] == [4.0, 4.0]
    assert m["stop_max_tokens/samples"] == m["stop_submitted/samples"] == 4.0
    # The per-cause numbers are the batch's, split: token-weighted means recombine to the whole.
    tokens = {k: sum(s.num_model_tokens for s in batch if k in causes(s, 2)) for k in stale}
    whole = sum(m[f"{k}/mismatch_kl"] * tokens[k] for k in stale) / sum(tokens.values())
    assert whole == pytest.approx(m["mismatch_kl"], rel=1e-6)
    assert m["stale_0/reward_mean"] == pytest.approx(sum(s.reward for s in batch[::2]) / 4)
    assert m["stop_max_tokens/length_mean"] == pytest.approx(sum(s.num_tokens for s in batch[:4]) / 4)
    # The mismatch is k3 of the engine's log-probs against the trainer's (before its update: a twin
    # that did not step), by hand for stale_0's samples.
    before = make_trainer(TrainConfig(lr=1e-2)).logprobs(batch)
    k3, n = 0.0, 0
    for s, lps in zip(batch, before, strict=True):
        if s.weight_version != 2:
            continue
        for lp, rollout, m_ in zip(lps, s.rollout_logprobs or (), s.loss_mask, strict=True):
            if m_:
                d = lp - rollout
                k3, n = k3 + math.exp(d) - d - 1, n + 1
    assert m["stale_0/mismatch_kl"] == pytest.approx(k3 / n, rel=1e-4)


def test_a_batch_from_several_task_sets_is_split_by_set_too() -> None:
    batch = [dataclasses.replace(s, task_set="swebench" if i % 2 else "builtin") for i, s in enumerate(_batch())]
    m = make_trainer(TrainConfig(lr=1e-2)).step(batch)
    assert m["set_builtin/samples"] == m["set_swebench/samples"] == 4.0
    assert m["set_builtin/length_mean"] == pytest.approx(sum(s.num_tokens for s in batch[::2]) / 4)
    one_set = make_trainer(TrainConfig(lr=1e-2)).step(_batch())
    assert not any(key.startswith("set_") for key in one_set)
