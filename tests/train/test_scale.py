"""The trainer at scale on CPU: FSDP2 ranks over gloo, packing, chunked log-probs, checkpoints across rank counts.

Every comparison is against the trainer running alone in this process, on the same batch of a
small Qwen3-architecture model: the ranks must train the same model, not a similar one.
"""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console
from safetensors.torch import load_file
from torch.distributed.checkpoint import FileSystemReader
from torch.utils._python_dispatch import TorchDispatchMode

import sandrl.train.async_ as async_driver
from sandrl.errors import TrainError
from sandrl.inference.model import build_tiny_model, load_model, save_weights
from sandrl.inference.tiny_config import TinyModelConfig
from sandrl.rollout.runner import Group
from sandrl.rollout.trajectory import Trajectory
from sandrl.train.batch import Batch
from sandrl.train.config import TrainConfig
from sandrl.train.group_sources import FileSource
from sandrl.train.lora_config import LoraConfig
from sandrl.train.losses import LossConfig
from sandrl.train.ranks import RankGroup, RankSpec
from sandrl.train.session import Session, make_trainer
from sandrl.train.trainer import Trainer

from ..train_drivers.conftest import run_config
from .helpers import sample

QWEN3 = TinyModelConfig(architecture="qwen3", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2)
CONFIG = TrainConfig(lr=1e-2, micro_batch_tokens=60)
"""A budget that cuts the batch into several micro-batches, more than the ranks, not a multiple of them."""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    net, tokenizer = build_tiny_model(QWEN3)
    return save_weights(net, tmp_path_factory.mktemp("qwen3") / "model", tokenizer)


def _batch() -> Batch:
    return Batch.of(
        sample("p" * i, "out" * (i % 3 + 1), advantage=(-1) ** i * 0.5, reward=float(i % 2)) for i in range(1, 8)
    )


def _alone(model_dir: Path, config: TrainConfig = CONFIG) -> Trainer:
    net, tokenizer, _ = load_model(str(model_dir))
    return Trainer(net, config, tokenizer=tokenizer)


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(next(path.glob("*.safetensors"))))


def _close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], tol: float = 1e-5) -> float:
    assert a.keys() == b.keys()
    worst = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
    assert worst <= tol, worst
    return worst


def test_two_gloo_ranks_train_like_one_process_and_their_checkpoint_resumes_on_one_and_on_two(
    model_dir: Path, tmp_path: Path
) -> None:
    alone = _alone(model_dir)
    expected = [alone.step(_batch()) for _ in range(2)]
    with RankGroup(RankSpec(str(model_dir), replace(CONFIG, processes=2))) as group:
        got = [group.step(_batch()) for _ in range(2)]
        for a, b in zip(expected, got, strict=True):
            assert abs(a["grad_norm"] - b["grad_norm"]) <= 1e-5 * max(a["grad_norm"], 1e-3)
            assert abs(a["loss"] - b["loss"]) <= 1e-6 and a["tokens"] == b["tokens"] and b["updates"] == 1
        two = _weights(group.export_weights(tmp_path / "two").path)
        _close(_weights(alone.export_weights(tmp_path / "alone").path), two)

        saved = group.save_checkpoint(tmp_path / "checkpoints")
        assert (saved / "state.json").is_file() and saved.name == "step-00000002"
        next_two = group.step(_batch())
        after_two = _weights(group.export_weights(tmp_path / "two-next").path)
        group.load_checkpoint(saved)  # two ranks resume their own checkpoint
        assert (group.steps, group.version) == (2, 2)
        again = group.step(_batch())
        assert again["grad_norm"] == pytest.approx(next_two["grad_norm"], rel=1e-6)
        _close(after_two, _weights(group.export_weights(tmp_path / "two-again").path))

        one = _alone(model_dir)
        one.load_checkpoint(saved)  # written by two ranks, resumed by one
        assert (one.steps, one.version) == (2, 2)
        resumed = one.step(_batch())
        assert resumed["grad_norm"] == pytest.approx(next_two["grad_norm"], rel=1e-5)
        _close(after_two, _weights(one.export_weights(tmp_path / "one").path))

        os.kill(group._procs[1].pid, signal.SIGKILL)  # a rank dies: the next call says which, and stops the rest
        with pytest.raises(TrainError, match=r"training rank 1 of 2 died \(exit code -9\) during step.*resume"):
            group.step(_batch())
        assert not group._procs
        with pytest.raises(TrainError, match="stopped after an earlier failure"):
            group.step(_batch())


@pytest.mark.parametrize("per_sample", [True, False], ids=["per-sample", "masked"])
def test_packed_and_padded_micro_batches_give_the_same_log_probs_and_gradients(
    model_dir: Path, per_sample: bool
) -> None:
    """Packed rows train exactly what padded rows train, with less padding: rows of the whole budget
    attended per sample (the trainer's default), or 3 x hidden rows under SDPA's row x row mask."""
    batch = Batch.of(sample("p" * (i % 7) ** 2, "out", advantage=(-1) ** i * 0.5) for i in range(40))
    roomy = replace(CONFIG, micro_batch_tokens=4096)
    packed, padded = _alone(model_dir, roomy), _alone(model_dir, replace(roomy, packing=False))
    assert packed.row_tokens == roomy.micro_batch_tokens
    if not per_sample:  # what a model that cannot attend per sample gets
        packed.policy.base.set_attn_implementation("sdpa")
        packed.row_tokens = 3 * 64
    for a, b in zip(packed.logprobs(batch.samples), padded.logprobs(batch.samples), strict=True):
        assert len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b, strict=True)) <= 1e-5
    m_packed, m_padded = packed.step(batch), padded.step(batch)
    assert m_packed["grad_norm"] == pytest.approx(m_padded["grad_norm"], rel=1e-5)
    assert m_padded["padding_frac"] >= 0.3  # the waste is reported
    assert m_packed["padding_frac"] <= (0.0 if per_sample else m_padded["padding_frac"] / 2)


class _WidestLogits(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """The largest tensor with a vocabulary-wide last dimension made by any op, forward or backward
    (the head's weight, ``[hidden, vocab]`` when transposed, aside)."""

    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.vocab, self.hidden, self.largest = vocab, hidden, 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor) and t.dim() > 1 and t.shape[-1] == self.vocab:
                rows = t.numel() // self.vocab
                if rows != self.hidden:
                    self.largest = max(self.largest, rows)
        return out


@pytest.mark.parametrize("chunk", [32, 100_000])
def test_log_probs_never_build_the_full_logits_of_a_micro_batch(model_dir: Path, chunk: int) -> None:
    trainer = _alone(model_dir, replace(CONFIG, micro_batch_tokens=4096, logprob_chunk_tokens=chunk))
    batch = _batch()
    tokens = sum(s.num_tokens for s in batch.samples)
    vocab, hidden = trainer.policy.head.weight.shape
    with _WidestLogits(vocab, hidden) as seen:
        trainer.step(batch)  # one packed micro-batch of every sample: forward and backward
    if chunk >= tokens:  # the control: the detector sees full logits when they are built
        assert seen.largest >= tokens - 1
    else:
        assert seen.largest <= chunk, f"a [{seen.largest}, vocab] tensor was built; the chunk is {chunk}"


def test_chunked_log_probs_and_entropy_equal_the_full_computation(model_dir: Path) -> None:
    net, _, _ = load_model(str(model_dir))
    trainer = Trainer(net, replace(CONFIG, logprob_chunk_tokens=7))
    ids = torch.randint(3, 250, (3, 21))
    out = trainer.policy(ids, chunk_tokens=7, entropy=True)
    logits = net(input_ids=ids, use_cache=False).logits.float()[:, :-1]
    full = torch.log_softmax(logits, -1)
    expected = full.gather(-1, ids[:, 1:, None]).squeeze(-1)
    assert torch.allclose(out.logprobs[:, 1:], expected, atol=1e-5)
    assert out.entropy is not None
    assert torch.allclose(out.entropy[:, 1:], -(full.exp() * full).sum(-1), atol=1e-5)


def test_activation_checkpointing_changes_memory_not_the_update(model_dir: Path) -> None:
    plain, checkpointed = _alone(model_dir), _alone(model_dir, replace(CONFIG, activation_checkpointing=True))
    a, b = plain.step(_batch()), checkpointed.step(_batch())
    assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-6)


def test_bf16_lora_ranks_with_a_kl_reference_compute_in_bf16_close_to_fp32(model_dir: Path, tmp_path: Path) -> None:
    """bf16 through FSDP2, LoRA, and the reference (the base: adapters scaled to 0, as a sharded unit needs)."""
    fp32 = _alone(model_dir).logprobs(_batch().samples)
    lora = LoraConfig(rank=4, target_modules=("q_proj", "v_proj"))
    config = replace(CONFIG, dtype="bf16", lora=lora, loss=LossConfig(beta=0.1))
    with RankGroup(RankSpec(str(model_dir), config)) as group:
        bf16 = group.logprobs(_batch().samples)  # the adapters start at zero: the base's log-probs
        metrics = [group.step(_batch()) for _ in range(2)]
        exported = _weights(group.export_weights(tmp_path).path)
    worst = max(abs(x - y) for a, b in zip(fp32, bf16, strict=True) for x, y in zip(a, b, strict=True))
    assert 0 < worst < 0.1  # bf16 compute: close, not equal
    assert [m["updates"] for m in metrics] == [1, 1] and metrics[0]["kl_mean"] == 0 < metrics[1]["kl_mean"]
    assert {t.dtype for t in exported.values()} == {torch.bfloat16}  # merged, in the training dtype


def _groups(count: int) -> list[Group]:
    groups = []
    for g in range(count):
        gid = f"run/t{g}#0"
        trajectories = []
        for i in range(4):
            s = sample("task" * (g + 1), "x" * (i + 2))
            trajectories.append(
                Trajectory(
                    f"{gid}/{i}",
                    gid,
                    f"t{g}",
                    i,
                    "test",
                    "completed",
                    reward=float(i % 2),
                    ids=list(s.token_ids),
                    loss_mask=list(s.loss_mask),
                    logprobs=[0.0] * s.num_tokens,
                    weight_version=0,
                )
            )
        groups.append(Group(gid, f"t{g}", trajectories))
    return groups


def test_the_async_driver_trains_two_ranks_as_it_trains_one(tmp_path: Path) -> None:
    """The drivers hand their batch to "the trainer": a group of ranks or this process, the same steps."""
    finals = []
    for processes in (1, 2):
        config = run_config(
            tmp_path / f"p{processes}",
            run={"steps": 3, "groups_per_step": 2},
            train={"processes": processes, "lr": 1e-3, "loss": {"loss_type": "dapo", "tis_cap": False}},
            **{"async": {"max_staleness": 8}},
        )
        trainer = make_trainer(config)
        assert isinstance(trainer, RankGroup) == (processes == 2)
        session = Session(config, FileSource(_groups(6), limit=6), trainer, mode="async", console=Console(quiet=True))
        try:
            asyncio.run(async_driver.run(session))
        finally:
            session.close()
        assert session.batches == 3 and session.version == 3
        finals.append(_weights(config.output_dir / "checkpoints" / "step-00000003" / "model"))
    _close(finals[0], finals[1])


def test_lora_trains_only_the_adapters_against_the_base_as_reference_and_checkpoints_them(
    model_dir: Path, tmp_path: Path
) -> None:
    lora = LoraConfig(rank=4, target_modules=("q_proj", "v_proj", "down_proj"))
    config = replace(CONFIG, lora=lora, loss=LossConfig(beta=0.1, tis_cap=None))
    trainer = _alone(model_dir, config)
    base = {k: v.clone() for k, v in trainer.model.get_base_model().state_dict().items() if ".lora_" not in k}
    metrics = [trainer.step(_batch()) for _ in range(3)]
    assert metrics[0]["kl_mean"] == 0 < metrics[-1]["kl_mean"]  # the reference is the base: adapters off
    after = trainer.model.get_base_model().state_dict()
    assert all(torch.equal(after[k], v) for k, v in base.items())  # the base never moves
    saved = trainer.save_checkpoint(tmp_path / "checkpoints")
    adapters = sum(p.numel() for p in trainer.policy.parameters() if p.requires_grad)
    # Per layer, rank x (in + out): q 64 -> 64, v 64 -> 32 (two key/value heads), down 128 -> 64.
    assert adapters == 2 * 4 * ((64 + 64) + (64 + 32) + (128 + 64))
    stored = FileSystemReader(saved / "state").read_metadata().state_dict_metadata
    weights = [k for k in stored if k.startswith("model.")]
    assert weights and all(".lora_" in k for k in weights)  # the adapters, not the base
    assert {k for k in stored if k.startswith("optim.state.")} and all(".lora_" in k for k in stored if "state." in k)
    resumed = _alone(model_dir, config)
    resumed.load_checkpoint(saved)
    assert resumed.step(_batch())["grad_norm"] == pytest.approx(trainer.step(_batch())["grad_norm"], rel=1e-6)


def test_two_ranks_broadcast_their_weights_to_two_engines_bit_for_bit_the_export(
    model_dir: Path, tmp_path: Path
) -> None:
    """Sharded training gathers its full tensors bucket by bucket and rank 0 sends them over gloo to two
    engines: each then holds exactly what the disk export of the same weights holds."""
    from sandrl.inference.engine import Engine
    from sandrl.inference.server import BackgroundServer, create_app
    from sandrl.inference.weight_push import BroadcastSpec

    token = "scale-test-token-0123456789abcdef"
    engines = [Engine.load(str(model_dir)) for _ in range(2)]
    try:
        with (
            BackgroundServer(create_app(engines[0], token=token)) as one,
            BackgroundServer(create_app(engines[1], token=token)) as two,
            RankGroup(RankSpec(str(model_dir), replace(CONFIG, processes=2))) as group,
        ):
            group.step(_batch())
            spec = BroadcastSpec((one.url, two.url), api_key=token, bucket_bytes=16 * 1024)  # many buckets
            assert group.broadcast_weights(spec) is None
            assert [e.weight_version for e in engines] == [group.version] * 2 == [1, 1]
            exported = _weights(group.export_weights(tmp_path / "two").path)
            for engine in engines:
                served = engine.model.state_dict()
                assert all(torch.equal(served[k], v.to(served[k].dtype)) for k, v in exported.items())
            group.step(_batch())  # the group is kept: the next push reuses it
            assert group.broadcast_weights(spec) is None and [e.weight_version for e in engines] == [2, 2]
            # an engine that refuses (its token differs): the ranks stay in step and say why, for the disk
            assert "401" in str(group.broadcast_weights(replace(spec, api_key="wrong")))
            assert group.step(_batch())["updates"] == 1
    finally:
        for engine in engines:
            engine.close()
