"""sandrl's packed attention: each sample of a packed row attended on its own, no row x row mask."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers

from sandrl.train import packed_attention
from sandrl.train.config import TrainConfig
from sandrl.train.packed_attention import NAME, _buckets, use_packed_attention
from sandrl.train.trainer import Trainer

# Grouped-query heads (4 query heads on 2 key/value heads), as Qwen3's.
QWEN3 = {
    "vocab_size": 300,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 4096,
}


def _model(**overrides: Any) -> Any:
    torch.manual_seed(0)
    return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**{**QWEN3, **overrides})).train()


def test_a_packed_row_gives_each_sample_what_it_gets_alone_forward_and_backward() -> None:
    model = _model()
    lengths = [700, 37, 20, 64, 5, 1, 300]  # long and short together: several buckets
    generator = torch.Generator().manual_seed(1)
    samples = [torch.randint(0, 300, (n,), generator=generator) for n in lengths]
    alone = [model(input_ids=s[None]).logits[0] for s in samples]
    sum(a.sum() for a in alone).backward()
    grads_alone = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()

    assert use_packed_attention(model) and model.config._attn_implementation == NAME
    pad = 13
    row = torch.cat([*samples, torch.zeros(pad, dtype=torch.long)])[None]
    positions = torch.cat([*(torch.arange(n) for n in lengths), torch.arange(pad)])[None]
    logits = model(input_ids=row, position_ids=positions).logits[0]
    offset = 0
    for n, expected in zip(lengths, alone, strict=True):
        torch.testing.assert_close(logits[offset : offset + n], expected, atol=1e-5, rtol=1e-5)
        offset += n
    logits[:offset].sum().backward()
    for name, grad in grads_alone.items():
        torch.testing.assert_close(dict(model.named_parameters())[name].grad, grad, atol=1e-4, rtol=1e-4)


def test_rows_of_a_batch_and_a_row_without_positions_are_samples_of_their_own() -> None:
    model = _model()
    ids = torch.randint(0, 300, (3, 50), generator=torch.Generator().manual_seed(2))
    expected = model(input_ids=ids).logits  # SDPA, causal, no mask
    use_packed_attention(model)
    torch.testing.assert_close(model(input_ids=ids).logits, expected, atol=1e-5, rtol=1e-5)
    # Positions that run on from one row into the next still start a sample at each row.
    positions = torch.arange(150).view(3, 50)
    torch.testing.assert_close(model(input_ids=ids, position_ids=positions % 50).logits, expected, atol=1e-5, rtol=1e-5)


def test_the_samples_borders_are_read_once_per_forward_not_once_per_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model(num_hidden_layers=3)
    use_packed_attention(model)
    calls: list[int] = []
    segments = packed_attention._segments
    monkeypatch.setattr(packed_attention, "_segments", lambda *a: calls.append(1) or segments(*a))
    ids = torch.randint(0, 300, (1, 40), generator=torch.Generator().manual_seed(3))
    positions = torch.cat([torch.arange(25), torch.arange(15)])[None]
    first = model(input_ids=ids, position_ids=positions).logits
    assert len(calls) == 1  # a host sync per forward, not per layer (3 here)
    other = torch.cat([torch.arange(15), torch.arange(25)])[None]  # another forward, other borders
    model(input_ids=ids, position_ids=other).logits.sum().backward()
    assert len(calls) == 2
    torch.testing.assert_close(model(input_ids=ids, position_ids=positions.clone()).logits, first)


def test_buckets_keep_similar_lengths_together_longest_first() -> None:
    buckets = _buckets([(0, 100), (100, 5), (105, 90), (195, 81), (276, 4), (280, 1000)])
    assert buckets == [([280], [1000]), ([0, 105, 195], [100, 90, 81]), ([100, 276], [5, 4])]
    assert all(min(sizes) >= packed_attention.BUCKET_RATIO * max(sizes) for _, sizes in buckets)


def test_only_models_that_attend_over_the_whole_row_switch() -> None:
    sliding = _model(use_sliding_window=True, sliding_window=32, max_window_layers=0)
    assert not use_packed_attention(sliding) and sliding.config._attn_implementation == "sdpa"
    eager = _model()
    eager.set_attn_implementation("eager")
    assert use_packed_attention(eager) and eager.config._attn_implementation == NAME


@pytest.mark.parametrize("packing", [True, False])
def test_the_trainer_packs_rows_of_the_whole_budget_only_when_it_attends_per_sample(packing: bool) -> None:
    trainer = Trainer(_model(), TrainConfig(micro_batch_tokens=4096, packing=packing, loss=TrainConfig().loss))
    attention = trainer.policy.base.config._attn_implementation
    assert (attention, trainer.row_tokens) == ((NAME, 4096) if packing else ("sdpa", 3 * QWEN3["hidden_size"]))


def test_a_switched_model_still_generates_as_before_with_a_cache_and_padding() -> None:
    model = _model().eval()
    prompts = torch.tensor([[0, 0, 5, 6, 7], [1, 2, 3, 4, 5]])  # the first left-padded
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])

    def generate() -> torch.Tensor:
        with torch.no_grad():
            out: torch.Tensor = model.generate(
                prompts, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0
            )
        return out

    before = generate()
    assert use_packed_attention(model)
    assert torch.equal(generate(), before)
