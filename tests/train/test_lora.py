"""LoRA in training (sandrl.train.lora): only the adapters train, the reference is the base with its adapters
off, checkpoints hold the adapters, and both exports give the trained model's log-probs when the embedded
engine serves them (a tiny Qwen3, a few AdamW steps of a supervised loss)."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import transformers
from safetensors import safe_open

from sandrl.errors import ConfigError
from sandrl.inference.base import SamplingParams
from sandrl.inference.engine import Engine
from sandrl.inference.lora_adapter import BASE_FILE
from sandrl.inference.model import build_tiny_model
from sandrl.train.lora import (
    LoraConfig,
    adapters_disabled,
    apply_lora,
    export_lora,
    load_lora_state_dict,
    lora_state_dict,
)
from tests.inference.lora_support import LORA, QWEN3, Trained, policy_logprobs, supervised_steps, train_and_export

PARAMS = SamplingParams(max_new_tokens=16, seed=5, ignore_eos=True)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    return train_and_export(tmp_path_factory.mktemp("lora"))


@pytest.fixture
def engine_on_base(trained: Trained) -> Iterator[Engine]:
    engine = Engine(copy.deepcopy(trained.base), trained.tokenizer)
    yield engine
    engine.close()


def test_only_the_adapters_change_in_training() -> None:
    model, tokenizer = build_tiny_model(QWEN3)
    policy = apply_lora(model, LORA)
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    # Every targeted layer of both decoder layers has its pair, and nothing else does.
    assert len(trainable) == 2 * 2 * len(LORA.target_modules)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    supervised_steps(policy, tokenizer, steps=3)
    after = dict(policy.named_parameters())
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed == trainable, sorted(changed ^ trainable)[:4]


def test_the_reference_is_the_base_with_adapters_off(trained: Trained) -> None:
    ids = torch.tensor([trained.tokenizer.encode("reference")])
    with torch.no_grad():
        base = trained.base(input_ids=ids).logits
        adapted = trained.policy(input_ids=ids).logits
        with adapters_disabled(trained.policy) as reference:
            off = reference(input_ids=ids).logits
        again = trained.policy(input_ids=ids).logits
    assert torch.equal(off, base)
    assert not torch.allclose(adapted, base, atol=1e-3), "the trained adapters should change the policy"
    assert torch.equal(again, adapted), "the adapters are back on after the block"


def test_an_unknown_target_module_is_one_line_naming_the_valid_ones() -> None:
    model, _ = build_tiny_model(QWEN3)
    with pytest.raises(ConfigError) as caught:
        apply_lora(model, LoraConfig(target_modules=("q_proj", "qkv_proj")))
    message = str(caught.value)
    assert "\n" not in message and "'qkv_proj'" in message and "'q_proj'" not in message
    for valid in ("down_proj", "gate_proj", "k_proj", "lm_head", "o_proj", "q_proj", "up_proj", "v_proj"):
        assert valid in message
    # The tied output layer would need the embeddings' weight changed: refused before peft touches the model.
    with pytest.raises(ConfigError, match="tie_word_embeddings"):
        apply_lora(model, LoraConfig(target_modules=("q_proj", "lm_head")))
    assert not any("lora" in n for n, _ in model.named_parameters())


def test_checkpoints_hold_the_adapters_and_restore_them(trained: Trained) -> None:
    state = lora_state_dict(trained.policy)
    assert state and all("lora_" in k for k in state)
    fresh = apply_lora(copy.deepcopy(trained.base), LORA)
    load_lora_state_dict(fresh, {k: v.clone() for k, v in state.items()})
    ids = torch.tensor([trained.tokenizer.encode("resume")])
    with torch.no_grad():
        assert torch.equal(fresh(input_ids=ids).logits, trained.policy(input_ids=ids).logits)
    other_rank = apply_lora(copy.deepcopy(trained.base), LoraConfig(rank=8, target_modules=LORA.target_modules))
    with pytest.raises(ConfigError, match="rank, target_modules") as caught:
        load_lora_state_dict(other_rank, state)
    assert "\n" not in str(caught.value)


def test_the_merged_export_is_a_plain_checkpoint_and_leaves_the_policy_as_it_was(
    trained: Trained, tmp_path: Path
) -> None:
    ids = torch.tensor([trained.tokenizer.encode("unchanged")])
    before = {n: p.detach().clone() for n, p in trained.policy.named_parameters()}
    with torch.no_grad():
        logits = trained.policy(input_ids=ids).logits
    again = export_lora(trained.policy, tmp_path / "again", LORA, trained.tokenizer)
    # The same from a given (gathered) state dict, as a sharded policy exports, even under torch.compile's names.
    given = {f"_orig_mod.{k}": v.clone() for k, v in trained.policy.state_dict().items()}
    from_given = export_lora(trained.policy, tmp_path / "given", LORA, trained.tokenizer, state_dict=given)
    assert (again / "model.safetensors").read_bytes() == (from_given / "model.safetensors").read_bytes()
    assert all(torch.equal(before[n], p) for n, p in trained.policy.named_parameters())
    with torch.no_grad():
        assert torch.equal(trained.policy(input_ids=ids).logits, logits)
    with safe_open(str(trained.merged / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
    assert keys and not any("lora" in k or "base_layer" in k or k.startswith("base_model") for k in keys)
    plain = transformers.AutoModelForCausalLM.from_pretrained(str(trained.merged), local_files_only=True)
    with torch.no_grad():
        assert torch.allclose(plain(input_ids=ids).logits, logits, atol=1e-5)
    # Nothing half-written is left beside the exports.
    assert sorted(p.name for p in trained.merged.parent.iterdir()) == ["adapter", "merged"]


async def test_the_engine_serving_the_merged_export_gives_the_trained_logprobs(trained: Trained) -> None:
    engine = Engine.load(str(trained.merged))
    try:
        prompt = trained.tokenizer.encode("serve the merged policy")
        g = await engine.generate(prompt, PARAMS)
    finally:
        await engine.aclose()
    assert g.output_logprobs == pytest.approx(policy_logprobs(trained.policy, prompt, g.output_ids), abs=1e-5)


async def test_the_engine_serving_the_adapter_gives_the_trained_logprobs(
    trained: Trained, engine_on_base: Engine
) -> None:
    engine = engine_on_base
    prompt = trained.tokenizer.encode("serve the adapter")
    base_alone = await engine.generate(prompt, PARAMS)
    await engine.load_lora_adapter("policy", str(trained.adapter))
    assert engine.lora_adapters == {"policy": str(trained.adapter)}
    # Concurrent requests with and without the adapter: each as if it were alone.
    named, base, named_again = await asyncio.gather(
        engine.generate(prompt, PARAMS, lora="policy"),
        engine.generate(prompt, PARAMS),
        engine.generate(prompt, PARAMS, lora="policy"),
    )
    assert named.output_logprobs == pytest.approx(policy_logprobs(trained.policy, prompt, named.output_ids), abs=1e-5)
    assert named_again.output_ids == named.output_ids
    assert base.output_ids == base_alone.output_ids
    assert base.output_logprobs == pytest.approx(base_alone.output_logprobs, abs=1e-6)
    assert named.output_ids != base.output_ids
    # As the served policy (update_weights with the adapter): requests that name none get it, at its version.
    assert await engine.update_weights(str(trained.adapter), version=7) == 7
    served = await engine.generate(prompt, PARAMS)
    assert served.output_ids == named.output_ids and served.output_weight_versions == [7] * 16
    assert engine.lora_adapter == str(trained.adapter)


def test_the_adapter_export_is_peft_files_and_the_base_marker(trained: Trained, tmp_path: Path) -> None:
    names = sorted(p.name for p in trained.adapter.iterdir())
    assert {"adapter_config.json", "adapter_model.safetensors", BASE_FILE} <= set(names)
    config = json.loads((trained.adapter / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], sorted(config["target_modules"])) == (
        4,
        8.0,
        sorted(LORA.target_modules),
    )
    marker = json.loads((trained.adapter / BASE_FILE).read_text())
    assert marker["model_type"] == "qwen3" and len(marker["shapes_sha256"]) == 64 and marker["fingerprint"]
    assert not any(p.name.startswith(".") for p in trained.adapter.parent.iterdir())
    # The same from a gathered state dict under other names (a compiled, sharded policy's).
    given = {f"_orig_mod.{k}": v.clone() for k, v in trained.policy.state_dict().items()}
    cfg = LoraConfig(rank=LORA.rank, alpha=LORA.alpha, target_modules=LORA.target_modules, export="adapter")
    again = export_lora(trained.policy, tmp_path / "given", cfg, state_dict=given)
    for name in ("adapter_model.safetensors", BASE_FILE):
        assert (again / name).read_bytes() == (trained.adapter / name).read_bytes(), name
