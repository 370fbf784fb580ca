"""The memory plan: exact counts from a config alone, a 7B run planned for 1, 2 and 8 GPUs, the refusal.

Its estimate against measured peaks is :mod:`tests.train.test_plan_measured`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from typer.testing import CliRunner

from sandrl.cli import app
from sandrl.errors import ConfigError
from sandrl.inference.model import build_tiny_model
from sandrl.train.config import TrainConfig
from sandrl.train.lora_config import LoraConfig
from sandrl.train.losses import LossConfig
from sandrl.train.model_shape import model_shape, shape_of
from sandrl.train.plan import (
    GPU_RESERVE,
    MemoryPlan,
    device_capacity,
    layer_activation_bytes,
    parse_size,
    plan_memory,
)

GIB = 1 << 30

QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "attention_bias": False,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "max_position_embeddings": 40960,
    "num_attention_heads": 32,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
}
"""Qwen/Qwen3-8B's published config.json (the dimensions; no weights are needed to plan)."""

SMALL = {**QWEN3_8B, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}
SMALL |= {"num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512}

RECIPE = TrainConfig(device="cuda", dtype="bf16", activation_checkpointing=True)
"""How a 7B model is trained on GPUs: bf16, checkpointing, the default 8192-token micro-batches."""


def _model_dir(root: Path, config: dict[str, object]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config))
    return root


@pytest.fixture(scope="module")
def qwen3_8b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _model_dir(tmp_path_factory.mktemp("qwen3-8b"), QWEN3_8B)


def test_counts_from_the_config_are_the_models_own(tmp_path: Path) -> None:
    model, _ = build_tiny_model()
    tiny = model_shape("tiny")
    assert tiny.parameters == sum(p.numel() for p in model.parameters())  # tied: the embedding counted once
    assert tiny.layer_parameters == sum(p.numel() for p in model.model.layers[0].parameters())

    directory = _model_dir(tmp_path / "small", SMALL)
    real = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(str(directory)))
    shape = model_shape(str(directory))
    assert shape.parameters == sum(p.numel() for p in real.parameters())
    assert (shape.layers, shape.hidden_size, shape.q_size, shape.kv_size, shape.qk_norm) == (2, 64, 64, 32, True)


def test_the_8b_config_is_counted_exactly_without_weights(qwen3_8b: Path) -> None:
    shape = model_shape(str(qwen3_8b))
    h, i, v, layers = 4096, 12288, 151936, 36
    attention = h * 32 * 128 * 2 + h * 8 * 128 * 2 + 2 * 128  # q, o; k, v; q_norm, k_norm
    layer = attention + 3 * h * i + 2 * h  # the MLP, two RMSNorms
    assert shape.layer_parameters == layer
    assert shape.parameters == layers * layer + 2 * v * h + h == 8_190_735_360  # "Qwen3-8B": 8.2B
    # LoRA rank 16 on every linear layer of every block: r * (in + out) each.
    per_layer = 16 * ((h + h) * 2 + (h + 1024) * 2 + (h + i) * 2 + (i + h))
    assert shape.lora_parameters(LoraConfig(rank=16)) == layers * per_layer == 43_646_976


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")  # peft's, not ours
def test_lora_adapters_are_counted_as_peft_adds_them(tmp_path: Path) -> None:
    import peft

    directory = _model_dir(tmp_path / "small", SMALL)
    for lora in (LoraConfig(rank=8), LoraConfig(rank=4, target_modules=("q_proj", "down_proj", "lm_head"))):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(str(directory)))
        wrapped = peft.get_peft_model(
            model, peft.LoraConfig(r=lora.rank, lora_alpha=int(lora.alpha), target_modules=list(lora.target_modules))
        )
        trained = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
        assert model_shape(str(directory)).lora_parameters(lora) == trained
        assert shape_of(wrapped, "peft").parameters == sum(p.numel() for p in wrapped.parameters())


def _saved_bytes(model: Any, tokens: int, *, layout: str) -> int:
    """Bytes autograd keeps for the backward of the decoder's forward over ``tokens`` (parameters aside)."""
    from sandrl.train.logprobs import PolicyForward
    from sandrl.train.packed_attention import use_packed_attention

    policy = PolicyForward(model)
    decoder = policy.decoder
    if layout == "packed":
        assert use_packed_attention(policy.base), "the trainer's packed rows attend per sample"
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        kept[storage.data_ptr()] = storage.nbytes()
        return tensor

    packed = layout != "unmasked"
    ids = torch.randint(0, int(model.config.vocab_size), (1, tokens) if packed else (4, tokens // 4))
    # Four samples end to end, positions restarting: Hugging Face's SDPA path masks across them
    # (masked), sandrl's packed attention attends per sample (packed).
    extra = {"position_ids": torch.arange(tokens // 4).repeat(4)[None]} if packed else {}
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        decoder(input_ids=ids, use_cache=False, **extra)  # as the trainer calls it (a cache hides the packing)
    return sum(n for ptr, n in kept.items() if ptr not in params)


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")  # peft's, not ours
@pytest.mark.parametrize("layout", ["unmasked", "masked", "packed"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize(
    "lora", [None, LoraConfig(rank=16), LoraConfig(rank=16, dropout=0.1)], ids=["full", "lora", "dropout"]
)
def test_a_layers_activations_are_what_autograd_keeps(layout: str, dtype: str, lora: LoraConfig | None) -> None:
    """The per-layer count against the tensors a real forward saves: one layer is the difference of 2 and 1."""
    import peft

    config = {**SMALL, "hidden_size": 128, "intermediate_size": 384, "head_dim": 32, "num_attention_heads": 4}
    tokens, compute = 256, 2 if dtype == "bf16" else 4
    saved = []
    for layers in (1, 2):
        torch.manual_seed(0)
        hf = transformers.Qwen3Config(**{**config, "num_hidden_layers": layers})
        model: Any = transformers.Qwen3ForCausalLM(hf)
        if lora is not None:
            model = peft.get_peft_model(
                model,
                peft.LoraConfig(r=lora.rank, lora_dropout=lora.dropout, target_modules=list(lora.target_modules)),
            )
        # bf16 as FSDP2's mixed precision computes: every parameter gathered in bf16, the adapters' too.
        model = model.to(torch.bfloat16 if compute == 2 else torch.float32)
        saved.append(_saved_bytes(model.train(), tokens, layout=layout))
    measured = (saved[1] - saved[0]) / tokens
    shape = shape_of(transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**config)), "small")
    planned = layer_activation_bytes(shape, compute, lora, mask_row=tokens if layout == "masked" else 0)
    assert measured * 0.9 <= planned <= measured * 1.1, (planned, measured)


def test_an_unknown_target_module_is_one_line_naming_the_models_layers() -> None:
    shape = model_shape("tiny")
    with pytest.raises(ConfigError) as info:
        shape.lora_parameters(LoraConfig(target_modules=("q_proj", "qkv_proj")))
    message = info.value.message
    assert message.startswith("[train.lora] target_modules: 'qkv_proj' names no linear layer of tiny; its linear")
    assert "q_proj" in message and "down_proj" in message and "\n" not in message
    with pytest.raises(ConfigError, match="'lm_head' shares its weight with the token embeddings"):
        shape.lora_parameters(LoraConfig(target_modules=("q_proj", "lm_head")))  # the tiny model ties them
    with pytest.raises(ConfigError, match="'embed_tokens' names no linear layer"):
        shape.lora_parameters(LoraConfig(target_modules=("embed_tokens",)))


def test_a_model_directory_without_a_config_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"has no config\.json"):
        model_shape(str(tmp_path))
    with pytest.raises(ConfigError, match="does not exist"):
        model_shape(str(tmp_path / "nope"))


@pytest.mark.parametrize(
    ("text", "size"),
    [("80GiB", 80 << 30), ("80G", 80 << 30), ("80 gib", 80 << 30), ("80GB", 80 * 10**9), ("512MiB", 512 << 20)],
)
def test_sizes(text: str, size: int) -> None:
    assert parse_size(text) == size
    assert parse_size("1.5TiB") == int(1.5 * (1 << 40)) and parse_size("4096") == 4096


@pytest.mark.parametrize("text", ["80 gigs", "", "-1GiB", "0GiB", "GiB"])
def test_a_bad_size_says_what_a_size_looks_like(text: str) -> None:
    with pytest.raises(ConfigError, match="--device-memory"):
        parse_size(text)


def test_a_gpu_this_machine_cannot_measure_needs_its_memory_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"--device-memory 80GiB"):
        device_capacity("cuda")
    with pytest.raises(ConfigError, match=r"planning for mps, whose memory this machine cannot measure"):
        device_capacity("mps")
    assert device_capacity("cuda:3", 80 << 30) == (80 << 30, "80.0 GiB given")
    memory, source = device_capacity("cpu")
    assert memory > 0 and "host memory available" in source


def test_qwen3_8b_planned_on_1_2_and_8_gpus_of_80gb(qwen3_8b: Path) -> None:
    shape = model_shape(str(qwen3_8b))

    def plan(processes: int, lora: LoraConfig | None = None) -> MemoryPlan:
        train = dataclasses.replace(RECIPE, processes=processes, lora=lora)
        return plan_memory(shape, train, device_memory=80 * GIB, longest_sample=2048)

    full = {n: plan(n) for n in (1, 2, 8)}
    lora = {n: plan(n, LoraConfig()) for n in (1, 2, 8)}
    assert full[8].fits and full[8].total < 40 * GIB
    assert not full[1].fits and full[1].total > 130 * GIB
    # Sharded: the optimizer's state of 8 ranks is 1/8 of one's.
    assert full[8].term("optimizer state") * 8 == pytest.approx(full[1].term("optimizer state"), rel=1e-6)
    for n in (1, 2, 8):
        assert lora[n].fits and lora[n].total < full[n].total
        assert lora[n].term("optimizer state") < 0.01 * full[n].term("optimizer state")
        assert lora[n].term("reference") == 0
    one = full[1]
    fixes = {c.setting: c for c in one.changes if c.fits}
    assert fixes["lora"].value == LoraConfig() and fixes["processes"].value == 3
    assert "[train.lora] rank = 16" in one.fix() and "[train] processes = 3 (--nproc 3)" in one.fix()
    assert [c.total for c in one.changes] == sorted(c.total for c in one.changes)
    assert all(c.total <= 0.9 * 80 * GIB for c in one.changes if c.fits)


def test_each_setting_moves_the_term_it_should(qwen3_8b: Path) -> None:
    shape = model_shape(str(qwen3_8b))

    def plan(**changes: Any) -> MemoryPlan:
        return plan_memory(shape, dataclasses.replace(RECIPE, **changes), device_memory=80 * GIB)

    base = plan(processes=8)
    ckpt_off = plan(processes=8, activation_checkpointing=False)
    assert ckpt_off.term("activations") > 5 * base.term("activations")
    assert plan(processes=8, logprob_chunk_tokens=256).term("log-prob buffers") < base.term("log-prob buffers")
    kl = plan(processes=8, loss=LossConfig(beta=0.05))
    assert kl.term("reference") == pytest.approx(shape.parameters * 4 / 8, abs=1)
    assert plan(processes=8, loss=LossConfig(beta=0.05), lora=LoraConfig()).term("reference") == 0
    offload = plan(processes=8, offload_optimizer=True)
    assert offload.term("optimizer state") == 0 and offload.host_offload > 0
    fp32 = plan(processes=8, dtype="fp32")
    assert fp32.term("activations") > 1.8 * base.term("activations")
    # On CPU every rank shares the host: more processes do not shrink the host's total.
    cpu = plan_memory(shape, dataclasses.replace(RECIPE, device="cpu", processes=2), device_memory=64 * GIB)
    assert cpu.ranks_per_device == 2 and cpu.total == 2 * cpu.per_rank
    assert all(c.setting not in ("processes", "offload_optimizer") for c in cpu.changes)


def test_a_gpu_keeps_a_reserve() -> None:
    plan = plan_memory(model_shape("tiny"), dataclasses.replace(RECIPE, processes=1), device_memory=10 * GIB)
    assert plan.usable == int(10 * GIB * (1 - GPU_RESERVE)) and plan.fits


def _config(tmp_path: Path, model: Path) -> Path:
    config = tmp_path / "run.toml"
    config.write_text(
        f'[run]\noutput_dir = "{tmp_path / "out"}"\n[model]\nname = "{model}"\n[tasks]\nfamily = "echo"\n'
    )
    return config


def test_sandrl_train_plan_for_8_gpus_from_a_machine_without_one(tmp_path: Path, qwen3_8b: Path) -> None:
    config = _config(tmp_path, qwen3_8b)
    args = ["train", str(config), "--plan", "--nproc", "8", "--set", "train.device=cuda", "--device-memory", "80GiB"]
    args += ["--set", "train.dtype=bf16", "--set", "train.activation_checkpointing=true"]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    line = json.loads(result.stdout.strip().splitlines()[-1])
    assert line["processes"] == 8 and line["fits"] and line["parameters"] == 8_190_735_360
    assert line["usable_bytes"] == int(80 * GIB * 0.9)
    assert "optimizer state" in result.stderr and "fits: " in result.stderr

    result = CliRunner().invoke(app, [*args[:3], "--set", "train.device=cuda", "--device-memory", "80GiB"])
    assert result.exit_code == 0, result.output
    assert not json.loads(result.stdout.strip().splitlines()[-1])["fits"]
    assert "[train.lora] rank = 16" in result.stderr  # printed as text, not read as markup
    assert not (tmp_path / "out").exists()


def test_a_run_that_cannot_fit_is_refused_before_anything_starts(tmp_path: Path, qwen3_8b: Path) -> None:
    # 8B parameters in fp32 with AdamW on a 64 GiB host: LoRA fits, full fine-tuning does not. The
    # directory holds only a config.json: a run that went on would fail to load weights instead.
    config = _config(tmp_path, qwen3_8b)
    result = CliRunner().invoke(app, ["train", str(config), "--device-memory", "64GiB"])
    assert isinstance(result.exception, ConfigError), result.output
    message = result.exception.message
    assert message.startswith("the trainer needs ") and "but cpu has 64.0 GiB usable (64.0 GiB given)" in message
    # Neither alone fits (fp32 activations of 8192 tokens x 36 layers are 100+ GiB): both together do.
    together = message.split("set together ", 1)[1].split(" (", 1)[0].split(", ")
    assert sorted(together) == ["[train.lora] rank = 16", "[train] activation_checkpointing = true"], message
    assert "sandrl train CONFIG --plan" in message
    assert "\n" not in message
    assert not (tmp_path / "out").exists()  # no config written, no sandbox or engine started
